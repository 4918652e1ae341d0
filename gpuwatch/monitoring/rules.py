"""Prometheus recording and alerting rules, generated from plain data (monitoring-mixin style).

Recording rules are named `level:metric:operations`; alerts are CamelCase, prefixed
`Gpuwatch`, carry a `severity` label and `summary`, `description` and `runbook_url`
annotations. Gauges are never fed to `rate()`: leak alerts use the daemon's own robust
estimate, ratios are ratios of summed counter rates. Leak, time-to-OOM and zone alerts
fire on the daemon's own verdict gauges (which carry its hysteresis), not on a re-thresholded
estimate, and `keep_firing_for` bridges a missed scrape or a daemon restart so that one
episode never pages twice.
"""

from __future__ import annotations

from gpuwatch.monitoring import serving_rules
from gpuwatch.monitoring.fleet_rules import FLEET_RULES_FILE, fleet_rules_document
from gpuwatch.monitoring.health_rules import hardware_alerts
from gpuwatch.monitoring.rule_base import (  # noqa: F401 - RuleParams & co. are used from here
    MIB,
    RUNBOOK_URL,
    Alert,
    Recording,
    RuleParams,
    _new_or_increased,
    _num,
    _rate_mib,
    _span,
    _value_of,
)

RULES_FILE = "gpuwatch.rules.yml"
ALERTS_FILE = "gpuwatch.alerts.yml"
PROMETHEUSRULE_FILE = "gpuwatch.prometheusrule.yml"
FORMATS = ("rules", "prometheusrule")


def recording_rules(p: RuleParams) -> list[Recording]:
    j = f'job="{p.job}"'
    engine = "job, instance, engine, kind, model"
    return [
        Recording("instance:gpuwatch_gpu_memory_used_bytes:sum",
                  f"sum by (job, instance) (gpuwatch_gpu_memory_used_bytes{{{j}}})"),
        Recording("instance:gpuwatch_gpu_memory_total_bytes:sum",
                  f"sum by (job, instance) (gpuwatch_gpu_memory_total_bytes{{{j}}})"),
        # a ratio of sums: a 24 GB GPU does not weigh as much as an 80 GB one
        Recording("instance:gpuwatch_gpu_memory_utilization:ratio",
                  f"instance:gpuwatch_gpu_memory_used_bytes:sum{{{j}}}\n"
                  f"/\ninstance:gpuwatch_gpu_memory_total_bytes:sum{{{j}}}"),
        Recording("job_zone:gpuwatch_gpus:count",
                  f'count_values by (job) ("zone", gpuwatch_gpu_memory_zone{{{j}}})'),
        Recording("instance_engine:gpuwatch_engine_prefix_cache_queries:rate5m",
                  f"sum by ({engine}) "
                  f"(rate(gpuwatch_engine_prefix_cache_queries_total{{{j}}}[5m]))"),
        Recording("instance_engine:gpuwatch_engine_prefix_cache_hits:rate5m",
                  f"sum by ({engine}) "
                  f"(rate(gpuwatch_engine_prefix_cache_hits_total{{{j}}}[5m]))"),
        # "> 0": an idle engine has no ratio rather than NaN, which graphs and compares badly
        Recording("instance_engine:gpuwatch_engine_prefix_cache_hit:ratio_rate5m",
                  f"instance_engine:gpuwatch_engine_prefix_cache_hits:rate5m{{{j}}}\n"
                  f"/\n(instance_engine:gpuwatch_engine_prefix_cache_queries:rate5m{{{j}}} > 0)"),
        # per model across every engine serving it: summed counters, not averaged ratios
        Recording("model:gpuwatch_engine_prefix_cache_hit:ratio_rate5m",
                  f"sum by (job, model) "
                  f"(instance_engine:gpuwatch_engine_prefix_cache_hits:rate5m{{{j}}})\n/\n"
                  f"(sum by (job, model) "
                  f"(instance_engine:gpuwatch_engine_prefix_cache_queries:rate5m{{{j}}}) > 0)"),
        Recording("instance_engine:gpuwatch_engine_preemptions:rate5m",
                  f"sum by ({engine}) (rate(gpuwatch_engine_preemptions_total{{{j}}}[5m]))"),
        Recording("model:gpuwatch_engine_requests_waiting:sum",
                  f"sum by (job, model) (gpuwatch_engine_requests_waiting{{{j}}})"),
        Recording("model:gpuwatch_engine_requests_running:sum",
                  f"sum by (job, model) (gpuwatch_engine_requests_running{{{j}}})"),
        Recording("instance_engine:gpuwatch_engine_requests_finished:rate5m",
                  f"sum by ({engine}) "
                  f"(rate(gpuwatch_engine_requests_finished_total{{{j}}}[5m]))"),
        Recording("instance_engine:gpuwatch_engine_requests_failed:rate5m",
                  f"sum by ({engine}) "
                  f'(rate(gpuwatch_engine_requests_finished_total{{{j},reason="error"}}[5m]))'),
        Recording("instance_engine:gpuwatch_engine_request_error:ratio_rate5m",
                  f"instance_engine:gpuwatch_engine_requests_failed:rate5m{{{j}}}\n/\n"
                  f"(instance_engine:gpuwatch_engine_requests_finished:rate5m{{{j}}} > 0)"),
        Recording("action_result:gpuwatch_remediation_actions:rate5m",
                  f"sum by (job, action, result) "
                  f"(rate(gpuwatch_remediation_actions_total{{{j}}}[5m]))"),
        *serving_rules.recording(p),
    ]


def alert_groups(p: RuleParams) -> dict[str, list[Alert]]:
    j = f'job="{p.job}"'
    ident = "{{ $labels.instance }} GPU {{ $labels.gpu }} ({{ $labels.uuid }})"
    # Who runs it, when gpuwatch knows: "pod X in namespace Y", the container, the Slurm job.
    who = ("{{ if $labels.pod }}, pod {{ $labels.pod }} in namespace {{ $labels.namespace }}"
           "{{ if $labels.container }}, container {{ $labels.container }}{{ end }}{{ end }}"
           "{{ if $labels.slurm_job_id }}, Slurm job {{ $labels.slurm_job_id }}{{ end }}")
    proc = (f"process {{{{ $labels.process }}}} (pid {{{{ $labels.pid }}}}{who}) on "
            "{{ $labels.instance }} GPU {{ $labels.gpu }}")
    eng = "engine {{ $labels.engine }} ({{ $labels.model }}) on {{ $labels.instance }}"
    ecc = f'gpuwatch_gpu_ecc_errors_total{{{j},type="uncorrected"}}'
    failed = f'gpuwatch_remediation_actions_total{{{j},result="failed"}}'
    gpu_keys, proc_keys = ("instance", "uuid"), ("instance", "uuid", "pid")
    gpu_rate = _value_of("gpuwatch_gpu_memory_leak_rate_bytes_per_second", p.job, gpu_keys,
                         "humanize1024", "B/s")
    proc_rate = _value_of("gpuwatch_process_memory_leak_rate_bytes_per_second", p.job,
                          proc_keys, "humanize1024", "B/s")
    ttoom = _value_of("gpuwatch_gpu_time_to_oom_seconds", p.job, gpu_keys, "humanizeDuration",
                      "")
    leak_keep = p.leak_keep_firing_for
    ooms = f'gpuwatch_process_ooms_total{{{j},outcome!="recovered"}}'
    oom_lead = _value_of("gpuwatch_process_oom_lead_time_seconds", p.job, proc_keys,
                         "humanizeDuration", " before", prefix="gpuwatch predicted it ",
                         missing="gpuwatch had not predicted it")
    # the daemon's own projection of the GPU's retained memory (time to OOM 0: past the
    # budget and still growing); its time_to_oom event names the processes growing most
    tto_text = (f"The memory {ident} keeps is growing: it reaches its memory budget in "
                f"{ttoom} (0s: already past it); the daemon's time_to_oom event names the "
                "processes growing most.")

    exporter = [
        Alert("GpuwatchExporterDown", f"up{{{j}}} == 0", "critical",
              "gpuwatch exporter is down.",
              "Prometheus has not scraped gpuwatch on {{ $labels.instance }} for 5 minutes: "
              "no GPU, engine or remediation alert can fire for that host.", "5m"),
        Alert("GpuwatchExporterAbsent", f"absent(up{{{j}}})", "critical",
              "gpuwatch has disappeared from Prometheus target discovery.",
              f'No target with job="{p.job}" has existed for 15 minutes: GPU hosts are '
              "unmonitored.", "15m"),
        Alert("GpuwatchNvmlDown", f"gpuwatch_nvml_up{{{j}}} == 0", "critical",
              "gpuwatch cannot read the NVIDIA driver.",
              "NVML has been unavailable to gpuwatch on {{ $labels.instance }} for 5 minutes: "
              "GPU memory, health and process metrics are missing.", "5m"),
    ]
    health = [
        Alert("GpuwatchGpuLost", f"gpuwatch_gpu_lost{{{j}}} == 1", "critical",
              "A GPU has fallen off the bus.",
              f"{ident} is reported lost by the driver; its workloads have failed and it "
              "needs a reset or a reboot.", "1m"),
        Alert("GpuwatchGpuEccUncorrectable", _new_or_increased(ecc, "10m"), "critical",
              "A GPU reported uncorrectable ECC errors.",
              f"{ident} counted uncorrectable (volatile) ECC errors in the last 10 minutes; "
              "drain it and check row remapping.", "0m"),
    ]
    memory = [
        # Verdict gauges carry the daemon's hysteresis: a short `for:` confirms a scrape,
        # warning is ">= 1" so that an escalation never resolves it (Alertmanager inhibits
        # the warning while the critical fires), keep_firing_for bridges scrape gaps.
        Alert("GpuwatchGpuMemoryZone", f"gpuwatch_gpu_memory_zone{{{j}}} >= 1", "warning",
              "GPU memory is in the warning zone.",
              f"{ident} has been in the threshold table's warning (yellow) memory zone or "
              "above for 10 minutes.", "10m", "2m"),
        Alert("GpuwatchGpuMemoryZone", f"gpuwatch_gpu_memory_zone{{{j}}} == 2", "critical",
              "GPU memory is in the critical zone.",
              f"{ident} has been in the threshold table's critical (red) memory zone for "
              "2 minutes: an OOM is close.", "2m", "2m"),
        Alert("GpuwatchGpuMemoryLeak",
              f"gpuwatch_gpu_memory_leak_severity{{{j}}} >= 1", "warning",
              "GPU memory keeps growing.",
              f"gpuwatch judges that memory no process accounts for on {ident} leaks: it "
              f"grows {gpu_rate} (warning slope {_rate_mib(p.leak_warning_bytes_per_second)}"
              ", warm-up and allocator sawtooth excluded).", "1m", leak_keep),
        Alert("GpuwatchGpuMemoryLeak",
              f"gpuwatch_gpu_memory_leak_severity{{{j}}} == 2", "critical",
              "GPU memory grows very fast.",
              f"gpuwatch judges that memory no process accounts for on {ident} leaks fast: "
              f"it grows {gpu_rate} (critical slope "
              f"{_rate_mib(p.leak_critical_bytes_per_second)}, or an OOM within "
              f"{_span(p.time_to_oom_critical_seconds)}).", "0m", leak_keep),
        Alert("GpuwatchProcessMemoryLeak",
              f"gpuwatch_process_memory_leak_severity{{{j}}} >= 1",
              "warning", "A process is leaking GPU memory.",
              f"gpuwatch judges that {proc} leaks: the GPU memory it keeps grows "
              f"{proc_rate} (warning slope {_rate_mib(p.leak_warning_bytes_per_second)}).",
              "1m", leak_keep),
        Alert("GpuwatchProcessMemoryLeak",
              f"gpuwatch_process_memory_leak_severity{{{j}}} == 2",
              "critical", "A process is leaking GPU memory very fast.",
              f"gpuwatch judges that {proc} leaks fast: the GPU memory it keeps grows "
              f"{proc_rate} (critical slope {_rate_mib(p.leak_critical_bytes_per_second)}"
              f", or an OOM within {_span(p.time_to_oom_critical_seconds)}).", "0m",
              leak_keep),
        Alert("GpuwatchGpuTimeToOom",
              f"gpuwatch_gpu_time_to_oom_severity{{{j}}} >= 1", "warning",
              f"A GPU will run out of memory within {_span(p.time_to_oom_warning_seconds)}.",
              f"{tto_text}", "1m", leak_keep),
        Alert("GpuwatchGpuTimeToOom",
              f"gpuwatch_gpu_time_to_oom_severity{{{j}}} == 2", "critical",
              f"A GPU will run out of memory within {_span(p.time_to_oom_critical_seconds)}.",
              f"{tto_text}", "0m", leak_keep),
        # An OOM is an occurrence: its counter rose (or its series appeared) in the last 10
        # minutes. The series outlives the process an hour, so the alert fires once, then
        # resolves. A failure a retry inside torch absorbed (recovered) is not paged.
        Alert("GpuwatchProcessOom", _new_or_increased(ooms, "10m"), "critical",
              "A process ran out of GPU memory.",
              f"{proc} ran out of GPU memory in the last 10 minutes "
              "({{ $labels.cause }}; the program's error: {{ $labels.outcome }}); "
              f"{oom_lead}. What its allocator held is kept in gpuwatch's snapshot "
              "directory (the process_oom event names the file).", "0m"),
        Alert("GpuwatchAllocatorFragmentation",
              f"gpuwatch_process_allocator_fragmentation_ratio{{{j}}} > "
              f"{_num(p.fragmentation_ratio)}", "warning",
              "A process's GPU allocator is fragmented.",
              f"The PyTorch allocator of {proc} holds "
              "{{ $value | humanizePercentage }} of its reserved memory in fragments it "
              "cannot reuse.", "5m"),
    ]
    engines = [
        Alert("GpuwatchEngineDown", f"gpuwatch_engine_up{{{j}}} == 0", "critical",
              "An inference engine does not answer.",
              f"gpuwatch could not read the metrics of {eng} for 5 minutes.", "5m"),
        serving_rules.kv_alert(p, j, eng),
        serving_rules.queue_alert(p, j, eng),
        Alert("GpuwatchEnginePreemptions",
              f"instance_engine:gpuwatch_engine_preemptions:rate5m{{{j}}} > "
              f"{_num(p.preemptions_per_second)}", "warning",
              "An inference engine keeps preempting requests.",
              f"{eng} preempts {{{{ $value | printf \"%.2f\" }}}} requests per second: "
              "its KV cache is too small for the load.", "15m"),
        *serving_rules.alerts(p, j, eng),
    ]
    remediation = [
        Alert("GpuwatchRemediationFailed", _new_or_increased(failed, "15m"), "warning",
              "A gpuwatch remediation action failed.",
              "The {{ $labels.action }} action of gpuwatch on {{ $labels.instance }} failed "
              "in the last 15 minutes; see the daemon's audit log.", "0m"),
    ]
    return {
        "gpuwatch-exporter": exporter,
        "gpuwatch-gpu-health": health + hardware_alerts(p),
        "gpuwatch-gpu-memory": memory,
        "gpuwatch-engines": engines,
        "gpuwatch-remediation": remediation,
    }


def rules_document(p: RuleParams) -> dict:
    return {"groups": [{"name": "gpuwatch.rules",
                        "rules": [r.to_dict() for r in recording_rules(p)]}]}


def alerts_document(p: RuleParams) -> dict:
    return {"groups": [
        {"name": name, "rules": [a.to_dict(p.runbook_url) for a in alerts]}
        for name, alerts in alert_groups(p).items()
    ]}


def prometheus_rule(p: RuleParams) -> dict:
    """The Prometheus Operator custom resource holding both the rules and the alerts."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": p.resource_name, "namespace": p.resource_namespace,
                     "labels": dict(p.resource_labels)},
        "spec": {"groups": rules_document(p)["groups"] + alerts_document(p)["groups"]},
    }


def alert_names(p: RuleParams | None = None) -> list[str]:
    """Every distinct alert name, in file order."""
    names: list[str] = []
    for alerts in alert_groups(p or RuleParams()).values():
        for a in alerts:
            if a.alert not in names:
                names.append(a.alert)
    return names


def render(p: RuleParams, fmt: str = "rules") -> dict[str, str]:
    """File name -> YAML text for one output format."""
    if fmt == "rules":
        docs = {RULES_FILE: rules_document(p), ALERTS_FILE: alerts_document(p),
                FLEET_RULES_FILE: fleet_rules_document(p)}
    elif fmt == "prometheusrule":
        docs = {PROMETHEUSRULE_FILE: prometheus_rule(p)}
    else:
        raise ValueError(f"format: {fmt!r}; choose from {', '.join(FORMATS)}")
    header = "# Generated by `gpuwatch alerts`; edit gpuwatch/monitoring/rules.py instead.\n"
    return {name: header + dump_yaml(doc) for name, doc in docs.items()}


def dump_yaml(doc: dict) -> str:
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str):
        # multi-line PromQL reads best as a literal block
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
