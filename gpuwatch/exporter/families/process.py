"""Per-process GPU memory; series of exited processes disappear with them."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import ATTRIBUTION_FIELDS

# Every process series carries these, attribution included ("" when unknown), so that
# queries join and aggregate by pod or job without a second lookup. Build label values
# with process_labels() only.
PROCESS_LABELS = ["gpu", "uuid", "pid", "process", *ATTRIBUTION_FIELDS]


def process_labels(gpu, proc) -> list[str]:
    return [str(gpu.index), gpu.uuid, str(proc.pid), proc.name,
            *(getattr(proc, name) for name in ATTRIBUTION_FIELDS)]


def collect(snap: Snapshot) -> Iterator[Metric]:
    if snap.tick is None:
        return
    used = GaugeMetricFamily(
        "gpuwatch_process_gpu_memory_used_bytes",
        "GPU memory used by the process as NVML reports it (absent when the driver cannot tell).",
        labels=PROCESS_LABELS,
    )
    info = GaugeMetricFamily(
        "gpuwatch_process_info", "Process identity on a GPU (value 1).",
        labels=[*PROCESS_LABELS, "user", "type"],
    )
    start = GaugeMetricFamily(
        "gpuwatch_process_start_time_seconds", "Process start time (Unix seconds).",
        labels=PROCESS_LABELS,
    )
    for g in snap.tick.gpus:
        for p in g.processes:
            lv = process_labels(g, p)
            info.add_metric([*lv, p.user, p.type], 1)
            if p.used_memory_bytes is not None:
                used.add_metric(lv, p.used_memory_bytes)
            if p.create_time is not None:
                start.add_metric(lv, p.create_time)
    yield used
    yield info
    yield start
