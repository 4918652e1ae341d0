"""A stand-in for torch's allocator surface at an OOM, in this process: memory_stats(),
memory_snapshot(), mem_get_info(), the OOM observer hook and OutOfMemoryError, with an
allocator that fails the way torch's does (observers first, then the exception, or no
exception when a retry inside got the memory)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

MIB = 1 << 20
GIB = 1 << 30


class OutOfMemoryError(RuntimeError):
    pass


def format_size(size: int) -> str:
    """torch's format_size (CUDACachingAllocator.cpp), as its OOM message prints sizes."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576:.2f} MiB"
    return f"{size / 1073741824:.2f} GiB"


def segment(total: int, blocks: list[tuple[int, str]], pool=(0, 0), device: int = 0,
            kind: str = "large") -> dict:
    return {"device": device, "address": 0, "total_size": total,
            "allocated_size": sum(s for s, st in blocks if st != "inactive"),
            "active_size": sum(s for s, st in blocks if st != "inactive"),
            "requested_size": 0, "stream": 0, "segment_type": kind, "segment_pool_id": pool,
            "is_expandable": False, "frames": [],
            "blocks": [{"size": s, "requested_size": s, "state": st} for s, st in blocks]}


class FakeTorch:
    """`torch` as the probe sees it: .cuda, .cuda.memory, ._C, OutOfMemoryError."""

    __version__ = "2.11.0+fake"
    OutOfMemoryError = OutOfMemoryError

    def __init__(self, total: int = 80 * GIB, free: int = 0, segments=None,
                 history: bool = False) -> None:
        self.total = total
        self.free = free
        self.segments = list(segments or [])
        self.num_ooms = 0
        self.history = history
        self.observers: list = []
        self.fail_stats = self.fail_snapshot = False
        self.cap: int | None = None  # set_per_process_memory_fraction
        self.cuda = SimpleNamespace(
            memory_stats=self.memory_stats, memory_snapshot=self.memory_snapshot,
            mem_get_info=lambda device=None: (self.free, self.total),
            get_device_properties=lambda i: SimpleNamespace(
                uuid=f"00000000-0000-0000-0000-{i:012d}", total_memory=self.total),
            device_count=lambda: 1, is_initialized=lambda: True,
            OutOfMemoryError=OutOfMemoryError,
            memory=SimpleNamespace(_snapshot=self._snapshot))
        self._C = SimpleNamespace(_cuda_attach_out_of_memory_observer=self.observers.append,
                                  _cuda_isHistoryEnabled=lambda: self.history)
        self.version = SimpleNamespace(cuda="13.0")

    def memory_stats(self, device=None) -> dict:
        if self.fail_stats:
            raise RuntimeError("allocator stats unavailable")
        segs = [s for s in self.segments if s["device"] == (device or 0)]
        reserved = sum(s["total_size"] for s in segs)
        split = sum(b["size"] for s in segs if len(s["blocks"]) > 1 for b in s["blocks"]
                    if b["state"] == "inactive")
        return {"allocated_bytes.all.current": sum(s["allocated_size"] for s in segs),
                "reserved_bytes.all.current": reserved,
                "reserved_bytes.all.peak": reserved,
                "inactive_split_bytes.all.current": split,
                "segment.all.current": len(segs), "num_ooms": self.num_ooms,
                "num_alloc_retries": 0, "max_split_size": -1}

    def memory_snapshot(self, mempool_id=None, include_traces=True) -> list:
        if self.fail_snapshot:
            raise RuntimeError("snapshot failed")
        return copy.deepcopy(self.segments)

    def _snapshot(self, device=None) -> dict:
        return {"segments": self.memory_snapshot(), "device_traces": [[
            {"action": "alloc", "size": 2 * MIB, "addr": i, "frames": []} for i in range(2000)]],
            "allocator_settings": {}, "external_annotations": []}

    # -- failing the way torch does ----------------------------------------------------------
    def fail(self, size: int, device: int = 0, raises: bool = True) -> None:
        """A request the allocator cannot serve: num_ooms rises, the observers are called
        with (device, size, the cap or the total, free), then OutOfMemoryError (raises), or
        nothing (a retry inside got the memory)."""
        self.num_ooms += 1
        for obs in list(self.observers):
            obs(device, size, self.cap if self.cap is not None else self.total, self.free)
        if raises:
            raise OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {format_size(size)}. GPU {device} has "
                f"a total capacity of {format_size(self.total)} of which "
                f"{format_size(self.free)} is free.")


def fragmented(holes: int, hole: int = 20 * MIB, seg_size: int = 2 * GIB) -> list[dict]:
    """Segments refilled with `hole`-sized blocks, every other one freed (free space that
    cannot go back to the driver: its segments are partly used)."""
    per = seg_size // hole
    segs = []
    for _ in range(holes):
        blocks = [(hole, "inactive" if i % 2 else "active_allocated") for i in range(per)]
        rest = seg_size - per * hole
        if rest:
            blocks.append((rest, "inactive"))
        segs.append(segment(seg_size, blocks))
    return segs


# torch._C as the probe reaches it, for a child process over the fake torch of
# tests/test_probe_agent.py: the observer hook, the error class, the history switch.
OOM_C = '''
observers = []
_cuda_attach_out_of_memory_observer = observers.append
class OutOfMemoryError(RuntimeError):
    pass
def _cuda_isHistoryEnabled():
    return False
'''


def oom_site(where):
    """A directory with a fake `torch` a child imports: the probe agent tests' one, plus
    OOM_C as torch._C and torch.OutOfMemoryError."""
    from tests.test_probe_agent import fake_torch

    site = fake_torch(where)
    (site / "torch" / "_C.py").write_text(OOM_C)
    init = site / "torch" / "__init__.py"
    init.write_text(init.read_text() + "from torch import _C  # noqa: E402\n"
                    "OutOfMemoryError = _C.OutOfMemoryError\n")
    return site
