"""Fleet recording rules, for the central Prometheus (or Thanos/Mimir ruler) that every edge
Prometheus remote-writes into: one series per cluster or model, never per host, process or
pod unless a rule says it keeps one (docs/fleet.md).

`cluster` is the external label each edge Prometheus adds (RuleParams.cluster_label); where
there is none, the rules still hold with one unnamed cluster.
"""

from __future__ import annotations

from gpuwatch.monitoring.rule_base import Recording, RuleParams

FLEET_RULES_FILE = "gpuwatch.fleet.rules.yml"
# labels no fleet aggregation may keep by accident (test_fleet.py checks each result)
HOST_LABELS = ("instance", "pid", "pod", "uuid", "gpu", "engine")


def recording(p: RuleParams) -> list[Recording]:
    j, c = f'job="{p.job}"', p.cluster_label
    ttft = "gpuwatch_engine_time_to_first_token_seconds"
    buckets = f"{c}_model_le:{ttft}_bucket:rate5m"
    verdict = (f"gpuwatch_gpu_memory_leak_severity{{{j}}} >= 1\nor\n"
               f"gpuwatch_process_memory_leak_severity{{{j}}} >= 1")
    series = f"gpuwatch_exposition_series{{{j}}}"
    return [
        # The bucket rates summed per cluster and model (le kept: they sum further, across
        # clusters or in a global view); quantiles from them, never from host quantiles.
        Recording(buckets, f"sum by ({c}, model, le) (rate({ttft}_bucket{{{j}}}[5m]))",
                  keeps=(c, "model", "le")),
        Recording(f"{c}_model:{ttft}:p99_rate5m",
                  f"histogram_quantile(0.99, {buckets})", keeps=(c, "model")),
        Recording(f"model:{ttft}:p99_rate5m",
                  f"histogram_quantile(0.99, sum by (model, le) ({buckets}))",
                  keeps=("model",)),
        # A GPU has a leak verdict when its own memory or one of its processes is judged
        # leaking; counted once per GPU.
        Recording(f"{c}:gpuwatch_gpus_with_leak_verdict:count",
                  f"count by ({c}) (\n  max by ({c}, instance, uuid) (\n"
                  + "\n".join("    " + line for line in verdict.splitlines()) + "\n  )\n)",
                  keeps=(c,)),
        Recording(f"{c}:gpuwatch_gpu_time_to_oom_seconds:min",
                  f"min by ({c}) (gpuwatch_gpu_time_to_oom_seconds{{{j}}})", keeps=(c,)),
        # the series budget per host, and what the fleet costs a tenant's series limit
        Recording(f"{c}:gpuwatch_exposition_series_per_host:max",
                  f"max by ({c}) ({series})", keeps=(c,)),
        Recording(f"{c}:gpuwatch_exposition_series:sum",
                  f"sum by ({c}) ({series})", keeps=(c,)),
        Recording(f"{c}:gpuwatch_hosts:count", f"count by ({c}) ({series})", keeps=(c,)),
    ]


def fleet_rules_document(p: RuleParams) -> dict:
    return {"groups": [{"name": "gpuwatch.fleet",
                        "rules": [r.to_dict() for r in recording(p)]}]}
