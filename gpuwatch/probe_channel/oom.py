"""The OOM record a probe leaves in its directory when its process runs out of GPU memory,
shared by the probe (which writes it) and the daemon (which adopts it).

`<probe dir>/<uid>/oom-<pid>-<seq>.json` (0600), one per OOM burst (the allocator's observer
can fire several times for one OOM: cuDNN retries with smaller workspaces), seq counting
from 1 in each process; beside it, where allocation history was being recorded,
`oom-<pid>-<seq>.pickle`: the `torch.cuda.memory._snapshot()` that pytorch.org/memory_viz
opens. The record is written at the first failed request and rewritten once the burst is
over (`final`), with what became of it (`outcome`).
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from gpuwatch.probe_channel.config import MAX_SEQ

FORMAT = "gpuwatch-oom"
VERSION = 1
MAX_RECORD_BYTES = 256 * 1024
TOP = 8  # segments and blocks named in a summary

NAME_RE = re.compile(r"oom-(\d{1,10})-(\d{1,3})\.json")

# outcome: pending (the burst goes on) | raised (an OutOfMemoryError reached the program and
# nothing caught it) | caught (the program caught it) | recovered (it never reached the
# program: a retry inside torch or a library, cuDNN's smaller workspace, got the memory) |
# unknown (this Python cannot tell; see `exited`)
OUTCOMES = ("pending", "raised", "caught", "recovered", "unknown")
# cause: full (free memory, the device's and the allocator's cache together, was short of
# the request) | fragmentation (enough was free in total, but in pieces, none large enough)
# | limit (the process's own cap, set_per_process_memory_fraction, was reached)
CAUSES = ("full", "fragmentation", "limit")

Bytes = Annotated[int, msgspec.Meta(ge=0)]
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]


class PoolSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One memory pool of the allocator: "default", or a private pool (a CUDA graph's, a
    MemPool) named by its id."""

    pool: str
    segments: Bytes = 0
    reserved_bytes: Bytes = 0
    allocated_bytes: Bytes = 0
    free_bytes: Bytes = 0  # inactive blocks inside its segments


class SegmentSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    total_bytes: Bytes
    allocated_bytes: Bytes = 0
    free_bytes: Bytes = 0
    largest_free_block_bytes: Bytes = 0
    blocks: Bytes = 0
    pool: str = "default"
    type: str = ""  # large | small
    expandable: bool = False


class AllocatorSummary(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The allocator of one device at the OOM, from memory_snapshot() (no traces)."""

    segments: Bytes = 0
    reserved_bytes: Bytes = 0
    allocated_bytes: Bytes = 0
    free_bytes: Bytes = 0  # inactive blocks: cached, free, inside partly used segments
    free_blocks: Bytes = 0
    largest_free_block_bytes: Bytes = 0
    # free memory stuck in split segments / reserved (the daemon's fragmentation ratio)
    fragmentation_ratio: Ratio | None = None
    largest_free_share: Ratio | None = None  # largest free block / free
    pools: list[PoolSummary] = []
    largest_segments: list[SegmentSummary] = []
    largest_blocks: list[Bytes] = []  # active blocks, largest first
    largest_free_blocks: list[Bytes] = []
    truncated: bool = False  # the snapshot was larger than the probe reads at an OOM


class OomRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    format: str = FORMAT
    version: int = VERSION
    pid: int
    seq: Annotated[int, msgspec.Meta(ge=1, le=MAX_SEQ)]
    create_time: float | None = None
    t: float  # the first failed request of the burst (wall clock)
    last_t: float | None = None  # its last
    final: bool = False
    device: Annotated[int, msgspec.Meta(ge=0)] = 0
    gpu_uuid: str | None = None
    torch_version: str = ""
    observer_calls: Annotated[int, msgspec.Meta(ge=1)] = 1
    request_bytes: Bytes  # what the first failed request asked the allocator for
    requests: list[Bytes] = []  # each call's, the first few
    device_free_bytes: Bytes  # cudaMemGetInfo's free at that moment, as torch reported it
    device_total_bytes: Bytes | None = None
    allowed_bytes: Bytes | None = None  # set_per_process_memory_fraction's cap, when set
    outcome: str = "pending"
    exited: bool = False  # the process exited before the burst was over
    cause: str = ""
    num_ooms: Bytes | None = None  # memory_stats() at the first call
    num_ooms_after: Bytes | None = None  # ... once the burst was over
    stats: dict[str, int] = {}  # memory_stats() at the first call, the .all.current gauges
    summary: AllocatorSummary = msgspec.field(default_factory=AllocatorSummary)
    history: str = ""  # the pickle beside it, when allocation history was recorded
    history_bytes: Bytes = 0
    notes: list[str] = []
    capture_seconds: float | None = None  # the host thread's time in the first call


record_decoder = msgspec.json.Decoder(OomRecord)
_encoder = msgspec.json.Encoder()


def encode(record: OomRecord) -> bytes:
    return _encoder.encode(record)


def record_name(pid: int, seq: int) -> str:
    return f"oom-{pid}-{seq}.json"


def history_name(pid: int, seq: int) -> str:
    return f"oom-{pid}-{seq}.pickle"


def classify(request: int, device_free: int, cached_free: int, reserved: int | None,
             allowed: int | None) -> str:
    """Why a request failed, from what was free at that moment.

    The allocator has already returned its wholly free segments to the driver when it gives
    up, so what it still caches is free space inside partly used segments: usable only by a
    request that fits one of its blocks. A request that the device's free memory and those
    blocks could hold together, but neither alone, failed on fragmentation."""
    if (allowed is not None and reserved is not None and reserved + request > allowed
            and device_free >= request):
        return "limit"
    if device_free + cached_free >= request:
        return "fragmentation"
    return "full"
