"""What the allocator held at an OOM, summarised from memory_snapshot(): per pool, the largest
segments and blocks, the free blocks and how scattered they are.

Pure (plain dicts in, structs out), bounded (at most MAX_BLOCKS blocks are looked at), and
run on the host's thread inside the OOM observer: it must stay cheap.
"""

from __future__ import annotations

import heapq
from typing import Any

from gpuwatch.probe_channel.oom import TOP, AllocatorSummary, PoolSummary, SegmentSummary

MAX_BLOCKS = 50_000  # about 0.1 s of the host thread on the 2 vCPU VM (benchmarks/oom_capture.py)
DEFAULT_POOL = "default"


def pool_name(seg: dict[str, Any]) -> str:
    """The segment's pool: the default pool is id (0, 0); a CUDA graph's private pool or a
    MemPool has its own id."""
    pid = seg.get("segment_pool_id")
    if pid is None:
        return DEFAULT_POOL
    try:
        a, b = (int(x) for x in pid)
    except (TypeError, ValueError):
        return str(pid)[:40]
    return DEFAULT_POOL if (a, b) == (0, 0) else f"{a},{b}"


def summarize(segments: list[dict[str, Any]], device: int,
              stats: dict[str, Any] | None = None, top: int = TOP) -> AllocatorSummary:
    out = AllocatorSummary()
    pools: dict[str, PoolSummary] = {}
    seg_rows: list[tuple[int, int, SegmentSummary]] = []
    active: list[int] = []
    free: list[int] = []
    split_free = 0
    seen = 0
    for n, seg in enumerate(segments):
        if int(seg.get("device", 0)) != device:
            continue
        blocks = seg.get("blocks") or ()
        if seen + len(blocks) > MAX_BLOCKS:
            out.truncated = True
            break
        seen += len(blocks)
        name = pool_name(seg)
        pool = pools.get(name)
        if pool is None:
            pool = pools[name] = PoolSummary(pool=name)
        total = int(seg.get("total_size", 0))
        allocated = int(seg.get("allocated_size", 0))
        seg_free = largest = 0
        for block in blocks:
            size = int(block.get("size", 0))
            if block.get("state") == "inactive":
                seg_free += size
                largest = max(largest, size)
                free.append(size)
            elif size > 0:
                active.append(size)
        if seg_free and seg_free < total:
            split_free += seg_free  # free, but the segment cannot go back to the driver
        pool.segments += 1
        pool.reserved_bytes += total
        pool.allocated_bytes += allocated
        pool.free_bytes += seg_free
        out.segments += 1
        out.reserved_bytes += total
        out.allocated_bytes += allocated
        row = SegmentSummary(total_bytes=total, allocated_bytes=allocated, free_bytes=seg_free,
                             largest_free_block_bytes=largest, blocks=len(blocks), pool=name,
                             type=str(seg.get("segment_type", ""))[:16],
                             expandable=bool(seg.get("is_expandable", False)))
        seg_rows.append((total, -n, row))
    out.free_bytes = sum(free)
    out.free_blocks = len(free)
    out.largest_free_block_bytes = max(free, default=0)
    out.pools = sorted(pools.values(), key=lambda p: (p.pool != DEFAULT_POOL, p.pool))
    out.largest_segments = [r for _, _, r in heapq.nlargest(top, seg_rows)]
    out.largest_blocks = heapq.nlargest(top, active)
    out.largest_free_blocks = heapq.nlargest(top, free)
    reserved = _stat(stats, "reserved_bytes.all.current")
    split = _stat(stats, "inactive_split_bytes.all.current")
    if reserved is None or split is None:  # no stats: the snapshot's own figures
        reserved, split = out.reserved_bytes, split_free
    if reserved:
        out.fragmentation_ratio = min(1.0, split / reserved)
    if out.free_bytes:
        out.largest_free_share = out.largest_free_block_bytes / out.free_bytes
    return out


def _stat(stats: dict[str, Any] | None, key: str) -> int | None:
    if not stats:
        return None
    value = stats.get(key)
    return int(value) if isinstance(value, int | float) else None


# memory_stats() keys kept in a record: the aggregate gauges and counters an OOM is read by.
STAT_KEYS = (
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
    "reserved_bytes.all.peak", "active_bytes.all.current", "inactive_split_bytes.all.current",
    "requested_bytes.all.current", "segment.all.current", "inactive_split.all.current",
    "allocation.all.current", "num_alloc_retries", "num_ooms", "num_sync_all_streams",
    "num_device_alloc", "num_device_free", "max_split_size",
    "reserved_bytes.large_pool.current", "reserved_bytes.small_pool.current",
)


def stats_subset(stats: dict[str, Any]) -> dict[str, int]:
    return {k: int(stats[k]) for k in STAT_KEYS if isinstance(stats.get(k), int | float)}
