"""Join NVML's pids with what the host knows about them (name, user, start time).

Names and users are bytes any user chooses (prctl, a binary's file name, /etc/passwd):
they enter the sample as valid text (gpuwatch.safetext.valid)."""

from __future__ import annotations

import psutil

from gpuwatch.model import ProcessSample
from gpuwatch.safetext import valid


class ProcessInfo:
    """Caches psutil lookups by pid; a changed create time means a new process (pid reuse)."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[float, str, str]] = {}

    def describe(self, pid: int, used: int | None, kind: str) -> ProcessSample:
        try:
            proc = psutil.Process(pid)
            create_time = proc.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            # Exited, or a pid from another PID namespace (container without hostPID).
            self._cache.pop(pid, None)
            return ProcessSample(pid=pid, used_memory_bytes=used, type=kind)
        cached = self._cache.get(pid)
        if cached is None or cached[0] != create_time:
            name = user = ""
            try:
                with proc.oneshot():
                    name = valid(proc.name())
                    user = valid(proc.username())
            except (psutil.Error, KeyError):
                pass  # KeyError: uid without a passwd entry
            cached = (create_time, name, user)
            self._cache[pid] = cached
        return ProcessSample(
            pid=pid, name=cached[1], user=cached[2], create_time=cached[0],
            used_memory_bytes=used, type=kind,
        )

    def forget_except(self, live: set[int]) -> None:
        for pid in [p for p in self._cache if p not in live]:
            del self._cache[pid]
