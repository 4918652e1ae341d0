"""Per-process GPU memory, and the host CPU time and resident memory next to it (as nvitop
shows them); series of exited processes disappear with them."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpuwatch.exporter.metric import CounterMetricFamily, GaugeMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import ATTRIBUTION_FIELDS

# Every process series carries these, attribution included ("" when unknown), so that
# queries join and aggregate by pod or job without a second lookup. Build label values
# with process_labels() only.
PROCESS_LABELS = ["gpu", "uuid", "pid", "process", *ATTRIBUTION_FIELDS]


def process_labels(gpu, proc) -> list[str]:
    return [str(gpu.index), gpu.uuid, str(proc.pid), proc.name,
            *(getattr(proc, name) for name in ATTRIBUTION_FIELDS)]


def pod_label_keys(snap: Snapshot) -> list[str]:
    """The allow-listed pod labels gpuwatch_process_info carries: the configured keys, then
    those the kubelet source's patterns matched on this tick's processes (at most 16)."""
    att = getattr(snap.config, "attribution", None)
    keys: list[str] = []
    for src in (getattr(att, "kubelet", None), getattr(att, "kubernetes_api", None)):
        if src is not None and src.enabled:
            keys += src.pod_labels
            if getattr(src, "pod_label_allowlist_regex", None) and snap.tick is not None:
                keys += sorted({k for g in snap.tick.gpus for p in g.processes
                                for k in p.pod_labels})
    return list(dict.fromkeys(keys))[:16]


def pod_annotation_keys(snap: Snapshot) -> list[str]:
    att = getattr(snap.config, "attribution", None)
    keys = [k for src in (getattr(att, "kubelet", None), getattr(att, "kubernetes_api", None))
            if src is not None and src.enabled for k in src.pod_annotations]
    return list(dict.fromkeys(keys))[:16]


def label_name(key: str, prefix: str = "label_") -> str:
    """A pod label (or annotation) key as a Prometheus label name, as kube-state-metrics
    writes it: label_app_kubernetes_io_name, annotation_..."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def collect(snap: Snapshot) -> Iterator[Metric]:
    if snap.tick is None:
        return
    keys = pod_label_keys(snap)
    annotation_keys = pod_annotation_keys(snap)
    meta_names = dict.fromkeys([*map(label_name, keys),
                                *(label_name(k, "annotation_") for k in annotation_keys)])
    used = GaugeMetricFamily(
        "gpuwatch_process_gpu_memory_used_bytes",
        "GPU memory used by the process as NVML reports it (absent when the driver cannot tell).",
        labels=PROCESS_LABELS,
    )
    info = GaugeMetricFamily(
        "gpuwatch_process_info", "Process identity on a GPU (value 1).",
        labels=[*PROCESS_LABELS, "user", "type", *meta_names],
    )
    start = GaugeMetricFamily(
        "gpuwatch_process_start_time_seconds", "Process start time (Unix seconds).",
        labels=PROCESS_LABELS,
    )
    cpu = CounterMetricFamily(
        "gpuwatch_process_cpu_seconds",
        "Host CPU time the process used, user and system (read every few seconds).",
        labels=PROCESS_LABELS,
    )
    rss = GaugeMetricFamily(
        "gpuwatch_process_resident_memory_bytes",
        "Host memory the process holds resident (RSS; read every few seconds).",
        labels=PROCESS_LABELS,
    )
    for g in snap.tick.gpus:
        for p in g.processes:
            lv = process_labels(g, p)
            if p.cpu_seconds_total is not None:
                cpu.add_metric(lv, p.cpu_seconds_total)
            if p.resident_memory_bytes is not None:
                rss.add_metric(lv, p.resident_memory_bytes)
            meta = {label_name(k): p.pod_labels.get(k, "") for k in keys}
            meta.update({label_name(k, "annotation_"): p.pod_annotations.get(k, "")
                         for k in annotation_keys})
            info.add_metric([*lv, p.user, p.type, *meta.values()], 1)
            if p.used_memory_bytes is not None:
                used.add_metric(lv, p.used_memory_bytes)
            if p.create_time is not None:
                start.add_metric(lv, p.create_time)
    yield used
    yield info
    yield start
    yield cpu
    yield rss
