"""Allocator state of this process, from torch.cuda.memory_stats() and memory_snapshot().

Runs inside the host process, on the probe's thread, with the torch module the host already
imported: nothing here imports torch or initialises CUDA.
"""

from __future__ import annotations

from typing import Any

# memory_stats() key -> ProbeSample field
STAT_FIELDS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "inactive_split_bytes.all.current": "inactive_split_bytes",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}
# Any of these non-zero: the process has used the device's allocator at some point.
_USED_KEYS = ("reserved_bytes.all.current", "reserved_bytes.all.peak",
              "reserved_bytes.all.allocated")


def from_stats(stats: dict[str, Any]) -> dict[str, int]:
    return {field: int(stats[key]) for key, field in STAT_FIELDS.items() if key in stats}


def device_used(stats: dict[str, Any]) -> bool:
    return any(stats.get(key) for key in _USED_KEYS)


def summarize_segments(segments: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per device: the free (inactive) blocks of the caching allocator, and its segments.

    Free blocks are what the allocator holds but no tensor uses; their sizes say whether a
    large request can be served from the cache or needs a new cudaMalloc.
    """
    out: dict[int, dict[str, Any]] = {}
    for seg in segments:
        dev = int(seg.get("device", 0))
        acc = out.get(dev)
        if acc is None:
            acc = out[dev] = empty_summary()
        acc["segments"] += 1
        for block in seg.get("blocks", ()):
            if block.get("state") != "inactive":
                continue
            size = int(block.get("size", 0))
            if size <= 0:
                continue
            acc["free_blocks"] += 1
            acc["total_free_bytes"] += size
            acc["largest_free_block_bytes"] = max(acc["largest_free_block_bytes"], size)
            small = acc["smallest_free_block_bytes"]
            acc["smallest_free_block_bytes"] = size if small is None else min(small, size)
    return out


def empty_summary() -> dict[str, Any]:
    return {"free_blocks": 0, "total_free_bytes": 0, "largest_free_block_bytes": 0,
            "smallest_free_block_bytes": None, "segments": 0}


class AllocatorReader:
    """Reads every device this process uses; remembers what the torch build supports."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.cuda = torch.cuda
        self._snapshot_kwargs: dict[str, Any] | None = {"include_traces": False}
        self._uuids: dict[int, str | None] = {}

    def read(self, with_snapshot: bool = True) -> list[dict[str, Any]]:
        cuda = self.cuda
        used = []
        for index in range(int(cuda.device_count())):
            stats = cuda.memory_stats(index)
            if device_used(stats):
                used.append((index, stats))
        if not used:
            return []
        summary = self._summary() if with_snapshot else None
        samples = []
        for index, stats in used:
            sample: dict[str, Any] = {"device": index, **from_stats(stats)}
            if summary is not None:
                sample.update({k: v for k, v in summary.get(index, empty_summary()).items()
                               if v is not None})
            uuid = self.uuid(index)
            if uuid:
                sample["gpu_uuid"] = uuid
            samples.append(sample)
        return samples

    def _summary(self) -> dict[int, dict[str, Any]] | None:
        return summarize_segments(self.segments())

    def segments(self) -> list[dict[str, Any]]:
        # include_traces=False (newer torch) skips the allocation history: much cheaper.
        if self._snapshot_kwargs:
            try:
                return self.cuda.memory_snapshot(**self._snapshot_kwargs)
            except TypeError:
                self._snapshot_kwargs = None
        return self.cuda.memory_snapshot()

    def reserved(self, index: int) -> int:
        return int(self.cuda.memory_stats(index).get("reserved_bytes.all.current", 0))

    def used_devices(self) -> list[int]:
        return [i for i in range(int(self.cuda.device_count()))
                if device_used(self.cuda.memory_stats(i))]

    def uuid(self, index: int) -> str | None:
        """The device's UUID as NVML spells it ("GPU-…"), to find it among NVML's GPUs
        whatever CUDA_VISIBLE_DEVICES renumbered."""
        if index not in self._uuids:
            value = None
            try:
                raw = getattr(self.cuda.get_device_properties(index), "uuid", None)
                if raw is not None:
                    text = str(raw)
                    value = text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"
            except Exception:
                value = None
            self._uuids[index] = value
        return self._uuids[index]
