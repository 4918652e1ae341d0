"""Who holds each GPU, from the kubelet's pod-resources API: a GPU is attributed even when
none of its processes is visible (a container in another PID namespace, no hostPID)."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch.exporter.metric import GaugeMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot


def collect(snap: Snapshot) -> Iterator[Metric]:
    owners = snap.extras.get("gpu_owners") or {}
    if snap.tick is None or not owners:
        return
    fam = GaugeMetricFamily(
        "gpuwatch_gpu_owner_info",
        "A container the kubelet assigned this GPU to (value 1; several under time-slicing).",
        labels=["gpu", "uuid", "namespace", "pod", "container"])
    for g in snap.tick.gpus:
        for ns, pod, container in owners.get(g.uuid, ()):
            fam.add_metric([str(g.index), g.uuid, ns, pod, container], 1)
    yield fam
