"""The daemon's own health: up, NVML up, per-source collection cost and errors."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch import __version__
from gpuwatch.exporter.metric import CounterMetricFamily, GaugeMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot


def collect(snap: Snapshot) -> Iterator[Metric]:
    yield GaugeMetricFamily("gpuwatch_up", "1 while the daemon serves.", value=1)
    build = GaugeMetricFamily("gpuwatch_build_info", "gpuwatch version (value 1).",
                              labels=["version"])
    build.add_metric([__version__], 1)
    yield build
    nvml = snap.sources.get("nvml")
    nvml_up = GaugeMetricFamily(
        "gpuwatch_nvml_up",
        "1 when the GPU backend (NVML, or the simulation) answered the last sample; the "
        "reason when it did not is in /api/state.",
        value=1 if nvml is not None and nvml.up else 0,
    )
    yield nvml_up
    duration = GaugeMetricFamily("gpuwatch_collect_duration_seconds",
                                 "Duration of the last collection, by source.",
                                 labels=["source"])
    errors = CounterMetricFamily("gpuwatch_collect_errors", "Failed collections, by source.",
                                 labels=["source"])
    last = GaugeMetricFamily("gpuwatch_last_collect_timestamp_seconds",
                             "Time of the last successful collection, by source.",
                             labels=["source"])
    for name, st in sorted(snap.sources.items()):
        if st.last_duration_seconds is not None:
            duration.add_metric([name], st.last_duration_seconds)
        errors.add_metric([name], st.errors_total)
        if st.last_success is not None:
            last.add_metric([name], st.last_success)
    yield duration
    yield errors
    yield last
    ticks = snap.extras.get("ticks")
    if ticks is not None:
        yield CounterMetricFamily(
            "gpuwatch_tick_failures",
            "Ticks (sample, analysis, outputs) that failed; /readyz answers 503 while the "
            "latest one did.", value=ticks.get("failures_total", 0))
    if snap.started:
        yield GaugeMetricFamily("gpuwatch_start_time_seconds",
                                "Daemon start time (Unix seconds).", value=snap.started)
