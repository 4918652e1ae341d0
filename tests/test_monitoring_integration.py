"""End to end: a real Prometheus scrapes `gpuwatch run --simulate ...` with the generated
rules loaded; every dashboard query returns data and the simulated leak fires the leak alert.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from gpuwatch.monitoring import rules
from tests.helpers import REPO, wait_until

pytestmark = pytest.mark.integration

# The daemon's leak analysis judges scales of a minute and more, and a series first seen
# already running only after a longest floor window; these settings let a test see leak
# rates and times to OOM within a minute or two.
FAST_LIFECYCLE = """
[signals.leak.lifecycle]
loading_settle_seconds = 5.0
warmup_settle_seconds = 10.0
warmup_max_seconds = 30.0
"""
FAST_SIGNALS = FAST_LIFECYCLE + """
[signals.kv_cache]
floor = 0.2
[signals.leak]
block_seconds = 5.0
max_floor_window_seconds = 20.0
scales_seconds = [20.0, 40.0, 120.0]
"""
# What Grafana would put in the dashboards' variables for this test's single target.
RATE_INTERVAL = "20s"
RANGE = "1m"


def _rule_files(tmp_path, pending: str | None = None, p: rules.RuleParams | None = None) -> list:
    """The generated rule files; `pending` shortens every alert's `for` (expressions,
    labels and annotations stay the generated ones) so a test need not wait 10 minutes."""
    p = p or rules.RuleParams()
    paths = []
    for name, doc in ((rules.RULES_FILE, rules.rules_document(p)),
                      (rules.ALERTS_FILE, rules.alerts_document(p)),
                      (rules.FLEET_RULES_FILE, rules.fleet_rules_document(p))):
        if pending is not None:
            for group in doc["groups"]:
                for rule in group["rules"]:
                    if "alert" in rule:
                        rule["for"] = pending
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(path)
    return paths


def _dashboard_queries(address: str) -> list[tuple[str, str, str, bool]]:
    """(dashboard, panel, PromQL with the variables filled in, instant) of every target."""
    values = {"$job": "gpuwatch", "$instance": address, "$gpu": ".*", "$engine": ".*",
              "$model": ".*", "$cluster": ".*", "$namespace": ".*", "$pod": ".*",
              "$__rate_interval": RATE_INTERVAL, "$__range": RANGE}
    out = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        dash = json.loads(path.read_text())
        panels = [q for p in dash["panels"] for q in (p, *p.get("panels", []))]
        for panel in panels:
            for target in panel.get("targets", []):
                expr = target["expr"]
                for var, value in values.items():
                    expr = expr.replace(var, value)
                assert "$" not in expr, f"unresolved variable in {expr}"
                out.append((dash["uid"], f"{panel['title']} [{target['refId']}]", expr,
                            target.get("instant", False)))
    return out


def _has_data(prom, expr: str, instant: bool) -> bool:
    """Raises for a query Prometheus cannot parse; False while it returns nothing."""
    if instant:
        return bool(prom.query(expr))
    end = time.time()
    result = prom.api("query_range", query=expr, start=end - 60, end=end, step=5)["result"]
    return any(series["values"] for series in result)


def test_every_dashboard_query_and_recording_rule_returns_data(daemon, prometheus, tmp_path):
    d = daemon("--simulate", "mixed", config_toml=FAST_SIGNALS)
    prom = prometheus([d.address], rule_files=_rule_files(tmp_path))
    prom.wait_for('up{job="gpuwatch"} == 1', timeout=30)

    pending = [*_dashboard_queries(d.address),
               *(("rules", r.record, r.record, True)
                 for r in rules.recording_rules(rules.RuleParams()))]
    assert len(pending) > 60
    # Leak rates need the (shortened) trend window; everything else comes within seconds.
    deadline = time.monotonic() + 210
    while pending and time.monotonic() < deadline:
        pending = [q for q in pending if not _has_data(prom, q[2], q[3])]
        if pending:
            time.sleep(5)
    assert not pending, "queries without data:\n" + "\n".join(
        f"  {uid} / {title}: {expr}" for uid, title, expr, _ in pending)


def test_simulated_leak_fires_the_generated_leak_alert(daemon, prometheus, tmp_path):
    d = daemon("--simulate", "leak", config_toml=FAST_LIFECYCLE)
    prom = prometheus([d.address], rule_files=_rule_files(tmp_path, pending="5s"))
    prom.wait_for('up{job="gpuwatch"} == 1', timeout=30)

    def leak_alerts():
        firing = [a for a in prom.alerts() if a["state"] == "firing"
                  and a["labels"]["alertname"] == "GpuwatchProcessMemoryLeak"
                  and a["labels"]["severity"] == "critical"]
        return firing or None

    firing = wait_until(leak_alerts, 200, interval=2, what="the generated leak alert to fire")
    # the leaking process, and only that one, is named
    assert {a["labels"]["process"] for a in firing} == {"leaky-worker"}
    alert = firing[0]
    assert alert["labels"]["job"] == "gpuwatch" and alert["labels"]["instance"] == d.address
    assert float(alert["value"]) == 2  # the daemon's verdict: critical
    # the description quotes the daemon's rate in MiB: 64 MiB/s as the scenario says
    desc = alert["annotations"]["description"]
    assert "leaky-worker" in desc and "(critical slope 50 MiB/s" in desc
    rate = float(desc.split("keeps grows ")[1].split("MiB/s")[0])
    # (the estimate when the alert first fires, over a short window, on a jittery host)
    assert 52 < rate < 80, desc
    assert alert["annotations"]["runbook_url"].endswith("#gpuwatchprocessmemoryleak")
    # the GPU's own verdict is about memory no process accounts for: nothing here
    assert not [a for a in prom.alerts() if a["labels"]["alertname"] == "GpuwatchGpuMemoryLeak"]
