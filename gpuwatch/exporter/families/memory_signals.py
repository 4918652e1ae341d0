"""Memory signals: leak rate, time to OOM, the leak verdict, zone and thresholds per GPU and
process, and the threshold table in use. A value the analyzers do not know has no series;
a judged process or GPU has its leak rate, time to OOM and verdict on every scrape until it
exits (a gap would restart every alert's `for:`)."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch.exporter.families.process import PROCESS_LABELS, process_labels
from gpuwatch.exporter.metric import GaugeMetricFamily, InfoMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot

L = ["gpu", "uuid"]


def collect(snap: Snapshot) -> Iterator[Metric]:
    derived = snap.derived
    table = InfoMetricFamily(
        "gpuwatch_threshold_table", "The threshold table GPUs are judged by.",
        labels=["version", "source", "base"],
    )
    if derived.threshold_table:
        t = derived.threshold_table
        table.add_metric([], {"version": t.get("version", ""), "source": t.get("source", ""),
                              "base": t.get("base", "")})
    yield table
    if snap.tick is None:
        return

    def gauge(name: str, doc: str, labels=L) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=labels)

    leak = gauge("gpuwatch_gpu_memory_leak_rate_bytes_per_second",
                 "Robust trend of the memory the GPU keeps: its processes' and its own.")
    ttoom = gauge("gpuwatch_gpu_time_to_oom_seconds",
                  "Seconds until the memory budget is spent at the current leak rate "
                  "(+Inf when not growing).")
    severity = gauge("gpuwatch_gpu_memory_leak_severity",
                     "The daemon's leak verdict on memory no process accounts for (all of it "
                     "without per-process figures): 0 none, 1 warning, 2 critical.")
    tto_severity = gauge("gpuwatch_gpu_time_to_oom_severity",
                         "The daemon's time-to-OOM verdict: 0 none, 1 under the warning "
                         "horizon, 2 under the critical horizon.")
    zone = gauge("gpuwatch_gpu_memory_zone", "Memory zone: 0 safe, 1 warning, 2 critical.")
    threshold = gauge("gpuwatch_gpu_memory_threshold_bytes",
                      "Memory above which the zone starts, from the threshold row.",
                      labels=[*L, "zone"])
    budget = gauge("gpuwatch_gpu_memory_budget_bytes",
                   "Usable memory budget (1 - alpha) x (total - system - reserve).")
    unplanned = gauge("gpuwatch_gpu_memory_unplanned_bytes",
                      "Used memory minus engines' pre-allocated pools: what the zone judges.")
    row_info = InfoMetricFamily("gpuwatch_gpu_threshold_row",
                                "The threshold row a GPU matched.",
                                labels=[*L, "row", "kind"])
    p_leak = gauge("gpuwatch_process_memory_leak_rate_bytes_per_second",
                   "Robust trend of the memory the process keeps (0 while loading unless "
                   "judged).", labels=PROCESS_LABELS)
    p_ttoom = gauge("gpuwatch_process_time_to_oom_seconds",
                    "Seconds until the GPU's memory budget is spent at this process's leak rate "
                    "(+Inf when not growing).", labels=PROCESS_LABELS)
    p_severity = gauge("gpuwatch_process_memory_leak_severity",
                       "The daemon's leak verdict on the process: 0 none, 1 warning, "
                       "2 critical.", labels=PROCESS_LABELS)
    for g in snap.tick.gpus:
        sig = derived.gpus.get(g.uuid)
        if sig is None:
            continue
        lv = [str(g.index), g.uuid]
        if sig.leak_rate_bytes_per_second is not None:
            leak.add_metric(lv, sig.leak_rate_bytes_per_second)
        if sig.time_to_oom_seconds is not None:
            ttoom.add_metric(lv, sig.time_to_oom_seconds)
        if sig.leak_severity is not None:
            severity.add_metric(lv, sig.leak_severity)
        if sig.time_to_oom_severity is not None:
            tto_severity.add_metric(lv, sig.time_to_oom_severity)
        if sig.zone is not None:
            zone.add_metric(lv, sig.zone)
        if sig.unplanned_memory_bytes is not None:
            unplanned.add_metric(lv, sig.unplanned_memory_bytes)
        for name in ("warning", "critical"):
            if name in sig.thresholds:
                threshold.add_metric([*lv, name], sig.thresholds[name])
        if "budget" in sig.thresholds:
            budget.add_metric(lv, sig.thresholds["budget"])
        if sig.threshold_row:
            kind = "calibrated" if sig.threshold_calibrated else "derived"
            row_info.add_metric(lv, {"row": sig.threshold_row, "kind": kind})
        for p in g.processes:
            psig = derived.processes.get((g.uuid, p.pid))
            if psig is None:
                continue
            plv = process_labels(g, p)
            if psig.leak_rate_bytes_per_second is not None:
                p_leak.add_metric(plv, psig.leak_rate_bytes_per_second)
            if psig.time_to_oom_seconds is not None:
                p_ttoom.add_metric(plv, psig.time_to_oom_seconds)
            if psig.leak_severity is not None:
                p_severity.add_metric(plv, psig.leak_severity)
    yield from (leak, ttoom, severity, tto_severity, zone, threshold, budget, unplanned,
                row_info, p_leak, p_ttoom, p_severity)
