"""The parts every rule generator builds on: the tunable parameters, the rule types and the
PromQL/annotation text helpers (rules.py assembles the files from the generators)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 1024 * 1024
RUNBOOK_URL = "https://github.com/gpuwatch/gpuwatch/blob/main/docs/runbook.md"

@dataclass(frozen=True)
class RuleParams:
    """Everything a site may want to tune; defaults follow spec/thresholds.md."""

    job: str = "gpuwatch"
    # the external label each edge Prometheus adds, that fleet rules aggregate by
    cluster_label: str = "cluster"
    runbook_url: str = RUNBOOK_URL
    # spec §2: warning at the table's slope (12 MiB/min sustained), critical at 50 MiB/s
    # (the daemon judges them; the alerts quote them)
    leak_warning_bytes_per_second: float = 12 * MIB / 60
    leak_critical_bytes_per_second: float = 50 * MIB
    # the daemon's [signals.time_to_oom] horizons
    time_to_oom_warning_seconds: float = 7200
    time_to_oom_critical_seconds: float = 1800
    # a verdict that disappears for a scrape or a daemon restart keeps the alert this long
    leak_keep_firing_for: str = "2m"
    # spec §4: compaction past 35 % fragmentation
    fragmentation_ratio: float = 0.35
    # The hit-ratio floor is the daemon's own ([signals.kv_cache] floor, exported as
    # gpuwatch_engine_kv_cache_hit_ratio_floor): what a good ratio is depends on the
    # workload's shared prefixes. Below this query rate (tokens/s) a ratio says nothing.
    kv_min_queries_per_second: float = 5.0
    # the daemon's [signals.queue] slo_quantile, slo_seconds and min_requests
    queue_latency_quantile: str = "0.95"
    queue_latency_slo_seconds: float = 5.0
    queue_min_requests: float = 10
    preemptions_per_second: float = 0.1
    # Serving SLOs per model (serving_rules.py): this share of requests gets its first
    # token within ttft_slo_seconds and its answer within e2e_slo_seconds (both bounds of
    # gpuwatch's bucket layout), and this share ends without an error; no burn-rate alert
    # on fewer than slo_min_requests requests in its short window. sli_quantile is the
    # quantile the dashboards draw.
    sli_quantile: str = "0.95"
    ttft_slo_seconds: float = 2.0
    e2e_slo_seconds: float = 60.0
    latency_objective: float = 0.99
    availability_objective: float = 0.99
    slo_min_requests: float = 20
    # NVLink CRC/replay/recovery errors per second, summed over links
    nvlink_errors_per_second: float = 0.1
    # PrometheusRule custom resource, in the DaemonSet's namespace. `release` is what
    # kube-prometheus-stack's ruleSelector matches by default: set it to your release's name.
    resource_name: str = "gpuwatch"
    resource_namespace: str = "gpuwatch"
    resource_labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "gpuwatch", "role": "alert-rules",
                                 "release": "kube-prometheus-stack"}
    )

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.:/-]+", self.job):
            raise ValueError(f"job: {self.job!r} is not a plain Prometheus job name")
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.cluster_label):
            raise ValueError(f"cluster_label: {self.cluster_label!r} is not a label name")
        if not re.fullmatch(r"[0-9.]+", self.queue_latency_quantile):
            raise ValueError(f"queue_latency_quantile: {self.queue_latency_quantile!r}")
        if not re.fullmatch(r"[0-9.]+", self.sli_quantile):
            raise ValueError(f"sli_quantile: {self.sli_quantile!r}")
        for name in ("latency_objective", "availability_objective"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name}: must be strictly between 0 and 1")
        # latency objectives must be bounds of gpuwatch's layout: the share of requests
        # under them is then a bucket, not an interpolation
        from gpuwatch.exposition.layout import BOUNDS

        for attr in ("ttft_slo_seconds", "e2e_slo_seconds"):
            v = float(getattr(self, attr))
            if v not in BOUNDS:
                raise ValueError(f"{attr}: {v:g} s is not a bound of gpuwatch's bucket layout "
                                 f"({', '.join(f'{b:g}' for b in BOUNDS)})")


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    # the labels an aggregation means to keep (checked where it is declared: fleet rules)
    keeps: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Alert:
    alert: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str = "0m"
    keep_firing_for: str = ""

    def to_dict(self, runbook_url: str) -> dict:
        out: dict = {"alert": self.alert, "expr": self.expr, "for": self.for_}
        if self.keep_firing_for:
            out["keep_firing_for"] = self.keep_firing_for
        return {
            **out,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": f"{runbook_url}#{self.alert.lower()}",
            },
        }


def _num(x: float) -> str:
    """Shortest exact text of a threshold for PromQL (209715.2, not 209715.19999999998)."""
    return repr(float(x)).removesuffix(".0")


def _rate_mib(bps: float) -> str:
    """52428800 -> '50 MiB/s', 209715.2 -> '12 MiB/min' (for annotations)."""
    mib = bps / MIB
    return f"{mib:g} MiB/s" if mib >= 1 else f"{mib * 60:g} MiB/min"


def _value_of(metric: str, job: str, labels: tuple[str, ...], fmt: str, suffix: str,
              prefix: str = "", missing: str = "n/a") -> str:
    """Template text quoting another series of the same subject (e.g. the rate behind a
    verdict), or `missing` when it is absent."""
    matchers = ",".join([f"job='{job}'", *(f"{k}='%s'" for k in labels)])
    args = " ".join(f"$labels.{k}" for k in labels)
    return (f'{{{{ with printf "{metric}{{{matchers}}}" {args} | query }}}}{prefix}'
            f"{{{{ . | first | value | {fmt} }}}}{suffix}{{{{ else }}}}{missing}{{{{ end }}}}")


def _span(seconds: float) -> str:
    """7200 -> '2 hours', 1800 -> '30 minutes' (for summaries)."""
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{_num(seconds)} seconds"


def _new_or_increased(metric: str, window: str) -> str:
    """A counter that went up in the window, or a series that appeared in it.

    The daemon creates XID and action series when the first one happens; increase() needs
    two samples, so a first occurrence alone would never fire.
    """
    return (f"increase({metric}[{window}]) > 0\nor\n"
            f"({metric} unless {metric} offset {window}) > 0")
