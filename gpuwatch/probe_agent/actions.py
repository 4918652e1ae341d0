"""What the probe does on request, inside the host process: flush the caching allocator,
or write its snapshot as the pickle PyTorch's memory visualizer (pytorch.org/memory_viz)
opens. Each returns the result dict the daemon receives; failures come back as
{"ok": False, "error": ...}, never as an exception in the host.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from typing import Any

from gpuwatch.probe_agent.stats import AllocatorReader
from gpuwatch.probe_channel import protocol

log = logging.getLogger(__name__)

MAX_HISTORY_ENTRIES = 1_000_000


def flush(reader: AllocatorReader) -> dict[str, Any]:
    """torch.cuda.empty_cache(): return cached, unused segments to the driver."""
    devices = reader.used_devices()
    before = {i: reader.reserved(i) for i in devices}
    t0 = time.perf_counter()
    reader.cuda.empty_cache()
    took = time.perf_counter() - t0
    after = {i: reader.reserved(i) for i in devices}
    total_before, total_after = sum(before.values()), sum(after.values())
    return {
        "ok": True,
        "released_bytes": max(total_before - total_after, 0),
        "reserved_before": total_before,
        "reserved_after": total_after,
        "duration_seconds": round(took, 6),
        "devices": {str(i): {"reserved_before": before[i], "reserved_after": after[i]}
                    for i in devices},
    }


def enable_history(torch: Any, max_entries: int) -> None:
    """Record allocation history (stack traces of allocs/frees) from now on."""
    max_entries = max(1, min(int(max_entries), MAX_HISTORY_ENTRIES))
    memory = torch.cuda.memory
    try:
        memory._record_memory_history("all", max_entries=max_entries)
    except TypeError:  # older torch: a bool and trace_alloc_max_entries
        memory._record_memory_history(True, trace_alloc_max_entries=max_entries)


def snapshot(torch: Any, params: dict[str, Any], pid: int, request_id: str,
             own_dir: str, own_dir_fd: int) -> dict[str, Any]:
    """Write torch.cuda.memory._snapshot() as a pickle into this process's own probe
    directory, under the one name the daemon expects; the daemon copies it out from there
    (it never acts on a path a probe names)."""
    record = params.get("record_history")
    if record:
        enable_history(torch, int(record))
    snap = torch.cuda.memory._snapshot()
    traces = snap.get("device_traces") or []
    entries = sum(len(t) for t in traces)
    with_history = bool(params.get("history"))
    if not with_history and entries:
        # The history can be large and was not asked for: keep the segments only.
        snap = dict(snap, device_traces=[[] for _ in traces])
    name = protocol.snapshot_name(pid, request_id)
    protocol.write_atomic(own_dir_fd, name, lambda f: pickle.dump(snap, f))
    result: dict[str, Any] = {
        "ok": True,
        "name": name,
        "path": os.path.join(own_dir, name),
        "segments": len(snap.get("segments") or ()),
        "bytes": os.stat(name, dir_fd=own_dir_fd, follow_symlinks=False).st_size,
        "history": with_history and entries > 0,
        "history_entries": entries if with_history else 0,
    }
    if with_history and not entries:
        result["note"] = ("allocation history is not being recorded: set "
                          "GPUWATCH_PROBE_RECORD_HISTORY_MAX_ENTRIES or request record_history")
    return result
