"""From an event to what it is about, checked against the latest sample: a GPU that is
there and not lost, a pid that is still on it (with the create time it was sampled with)."""

from __future__ import annotations

from typing import Any

from gpuwatch.events import Event
from gpuwatch.remediation.hooks import Refused, Target


def resolve(event: Event, snap: Any, engine_pids: dict[str, list[int]]) -> Target:
    """The target of an event; raises Refused when acting on it would be acting blind."""
    tick = getattr(snap, "tick", None)
    if tick is None:
        raise Refused("no sample yet")
    gpus = {g.uuid: g for g in tick.gpus}
    if event.pid is not None:
        if event.gpu_uuid:
            gpu = _live_gpu(gpus, event.gpu_uuid)
            return _process_target(gpu, event.pid, event.engine)
        for gpu in gpus.values():  # pid without a GPU: wherever it runs now
            if any(p.pid == event.pid for p in gpu.processes):
                return _process_target(_live_gpu(gpus, gpu.uuid), event.pid, event.engine)
        raise Refused(f"pid {event.pid} is on no GPU in the latest sample")
    if event.gpu_uuid:
        gpu = _live_gpu(gpus, event.gpu_uuid)
        pid = offending_pid(gpu, snap)
        if pid is None:
            return Target(kind="gpu", gpu_uuid=gpu.uuid, gpu_index=gpu.index)
        return _process_target(gpu, pid, event.engine)
    if event.engine:
        for pid in engine_pids.get(event.engine, ()):
            for gpu in gpus.values():
                if not gpu.lost and any(p.pid == pid for p in gpu.processes):
                    return _process_target(gpu, pid, event.engine)
        return Target(kind="engine", engine=event.engine)
    raise Refused("the event names no GPU, process or engine")


def event_label(event: Event) -> str:
    """How an action's target is named before (or without) resolving it."""
    if event.pid is not None:
        return f"{event.gpu_uuid or 'gpu:?'}/pid:{event.pid}"
    if event.gpu_uuid:
        return event.gpu_uuid
    return f"engine:{event.engine}" if event.engine else "unknown"


def offending_pid(gpu: Any, snap: Any) -> int | None:
    """The process most likely responsible for a GPU-wide condition: the fastest positive
    leak rate, else the largest user of memory."""
    derived = getattr(snap, "derived", None)
    procs = getattr(derived, "processes", {}) if derived is not None else {}
    leaking = [
        (sig.leak_rate_bytes_per_second, pid) for (uuid, pid), sig in procs.items()
        if uuid == gpu.uuid and (sig.leak_rate_bytes_per_second or 0) > 0
        and any(p.pid == pid for p in gpu.processes)
    ]
    if leaking:
        return max(leaking)[1]
    used = [(p.used_memory_bytes or 0, p.pid) for p in gpu.processes]
    return max(used)[1] if used else None


def _live_gpu(gpus: dict[str, Any], uuid: str) -> Any:
    gpu = gpus.get(uuid)
    if gpu is None:
        raise Refused(f"GPU {uuid} is not in the latest sample")
    if gpu.lost:
        raise Refused(f"GPU {uuid} is lost")
    return gpu


def _process_target(gpu: Any, pid: int, engine: str | None) -> Target:
    proc = next((p for p in gpu.processes if p.pid == pid), None)
    if proc is None:
        raise Refused(f"pid {pid} is no longer on GPU {gpu.uuid}")
    return Target(kind="process", gpu_uuid=gpu.uuid, gpu_index=gpu.index, pid=pid,
                  create_time=proc.create_time, process_name=proc.name, engine=engine)
