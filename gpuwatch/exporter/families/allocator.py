"""The PyTorch caching allocator of processes that run gpuwatch's probe (and only those:
without a probe there are no allocator series, rather than invented ones)."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch.exporter.families.process import PROCESS_LABELS, process_labels
from gpuwatch.exporter.metric import CounterMetricFamily, GaugeMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import ProcessSample
from gpuwatch.signals.fragmentation import locate

P = "gpuwatch_process_allocator_"

# ProbeSample field -> (metric suffix, help)
GAUGES = {
    "allocated_bytes": ("allocated_bytes", "Bytes the allocator has handed out to tensors."),
    "reserved_bytes": ("reserved_bytes",
                       "Bytes the allocator holds from the driver (allocated + cached)."),
    "inactive_split_bytes": ("inactive_split_bytes",
                             "Free bytes in split segments, which empty_cache() cannot return."),
    "total_free_bytes": ("free_bytes", "Bytes in the allocator's free (cached) blocks."),
    "largest_free_block_bytes": ("largest_free_block_bytes",
                                 "The largest free block: the largest request the cache can "
                                 "serve without a new cudaMalloc."),
    "free_blocks": ("free_blocks", "Number of free blocks in the allocator's cache."),
}
COUNTERS = {
    "num_alloc_retries": ("alloc_retries", "cudaMalloc failures that made the allocator flush "
                                           "its cache and retry."),
    "num_ooms": ("ooms", "Out-of-memory errors the allocator raised."),
}


def collect(snap: Snapshot) -> Iterator[Metric]:
    if snap.tick is None:
        return
    gauges = {f: GaugeMetricFamily(P + name, text, labels=PROCESS_LABELS)
              for f, (name, text) in GAUGES.items()}
    counters = {f: CounterMetricFamily(P + name, text, labels=PROCESS_LABELS)
                for f, (name, text) in COUNTERS.items()}
    ratio = GaugeMetricFamily(
        P + "fragmentation_ratio",
        "inactive_split / reserved: the share of the allocator's pool that is free but "
        "stuck in split segments (spec section 4).", labels=PROCESS_LABELS)
    outside = GaugeMetricFamily(
        P + "unattributed_bytes",
        "NVML's per-process used memory minus the allocator's reserved bytes (CUDA context, "
        "NCCL, libraries outside PyTorch's allocator).", labels=PROCESS_LABELS)
    seen = set()
    for probe, gpu in locate(snap.tick):
        if (gpu.uuid, probe.pid) in seen:
            continue
        seen.add((gpu.uuid, probe.pid))
        proc = next((p for p in gpu.processes if p.pid == probe.pid),
                    ProcessSample(pid=probe.pid))
        lv = process_labels(gpu, proc)
        for f, fam in (*gauges.items(), *counters.items()):
            value = getattr(probe, f)
            if value is not None:
                fam.add_metric(lv, value)
        sig = snap.derived.processes.get((gpu.uuid, probe.pid))
        if sig is None:
            continue
        # (the largest-free share and free blocks per MiB are ratios of the gauges above)
        for fam, value in ((ratio, sig.fragmentation_ratio), (outside, sig.unattributed_bytes)):
            if value is not None:
                fam.add_metric(lv, value)
    yield from gauges.values()
    yield from counters.values()
    yield from (ratio, outside)
