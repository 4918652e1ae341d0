"""gpuwatch_remediation_actions_total{action,result}: every action and every skip.

All known (action, result) pairs are exported from the start, at zero, so rate() and
increase() see the first action instead of a series that appears out of nowhere.
"""

from __future__ import annotations

from gpuwatch.exporter.metric import CounterMetricFamily

ACTIONS = ("flush", "snapshot", "signal", "exec")
RESULTS = ("ok", "failed", "dry_run", "skipped_cooldown", "skipped_rate_limit", "refused")


def collect(snap):
    counts = (getattr(snap, "extras", None) or {}).get("remediation") or {}
    fam = CounterMetricFamily(
        "gpuwatch_remediation_actions",
        "Remediation actions decided, by action and result (skips and refusals included).",
        labels=["action", "result"],
    )
    pairs = {(a, r): 0 for a in ACTIONS for r in RESULTS}
    for key, value in counts.items():
        if isinstance(key, tuple) and len(key) == 2:
            pairs[(str(key[0]), str(key[1]))] = value
    for (action, result), value in sorted(pairs.items()):
        fam.add_metric([action, result], float(value))
    yield fam
