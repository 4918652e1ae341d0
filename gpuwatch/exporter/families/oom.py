"""OOMs the probes recorded (signals/process_oom.py).

gpuwatch_process_ooms_total{process labels, cause, outcome} counts a process's OOMs on a GPU;
its series stays an hour after the process's last OOM (an OOM often ends the process: its
alert must still see the counter, then resolve). gpuwatch_gpu_ooms_total is there for every
GPU from the start, at zero, so increase() sees the first. The lead time gauge says how long
before the last OOM gpuwatch's first leak or time-to-OOM event fired; absent when nothing
predicted it.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch.exporter.families.process import PROCESS_LABELS
from gpuwatch.exporter.metric import CounterMetricFamily, GaugeMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import ATTRIBUTION_FIELDS


def collect(snap: Snapshot) -> Iterator[Metric]:
    derived = snap.derived
    per_process = CounterMetricFamily(
        "gpuwatch_process_ooms",
        "Out-of-memory failures of a process on a GPU, as its probe recorded them (one per "
        "OOM burst), by cause (full, fragmentation, limit) and outcome (raised, caught, "
        "recovered, unknown).",
        labels=[*PROCESS_LABELS, "cause", "outcome"])
    lead = GaugeMetricFamily(
        "gpuwatch_process_oom_lead_time_seconds",
        "How long before the process's last OOM gpuwatch's first leak or time-to-OOM event "
        "on that GPU fired (absent when nothing predicted it).",
        labels=PROCESS_LABELS)
    per_gpu = CounterMetricFamily(
        "gpuwatch_gpu_ooms", "Out-of-memory failures the probes recorded on a GPU.",
        labels=["gpu", "uuid"])
    index = {g.uuid: g.index for g in snap.tick.gpus} if snap.tick is not None else {}
    for (uuid, pid), tally in sorted(derived.ooms.items()):
        gpu = tally.gpu_index if tally.gpu_index is not None else index.get(uuid)
        labels = [str(gpu) if gpu is not None else "", uuid, str(pid), tally.name,
                  *(tally.owner.get(f, "") for f in ATTRIBUTION_FIELDS)]
        for (cause, outcome), n in sorted(tally.counts.items()):
            per_process.add_metric([*labels, cause, outcome], n)
        if tally.last_lead_seconds is not None:
            lead.add_metric(labels, tally.last_lead_seconds)
    for uuid in sorted(set(index) | set(derived.gpu_ooms)):
        gpu = index.get(uuid)
        per_gpu.add_metric([str(gpu) if gpu is not None else "", uuid],
                           derived.gpu_ooms.get(uuid, 0))
    yield per_process
    yield lead
    yield per_gpu
