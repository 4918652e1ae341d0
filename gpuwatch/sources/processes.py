"""Join NVML's pids with what the host knows about them: name, user, start time, and (as nvitop
shows next to GPU memory) CPU time and resident memory.

Names and users are bytes any user chooses (prctl, a binary's file name, /etc/passwd):
they enter the sample as valid text (gpuwatch.safetext.valid)."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from gpuwatch.model import ProcessSample
from gpuwatch.safetext import valid

# CPU and resident memory are read again after this long: two /proc reads per process,
# cheap for a few, not for hundreds on every 1 s tick.
HOST_REFRESH_SECONDS = 5.0


class ProcessInfo:
    """Caches psutil lookups by pid; a changed create time means a new process (pid reuse)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 host_refresh: float = HOST_REFRESH_SECONDS) -> None:
        self._cache: dict[int, tuple[float, str, str]] = {}
        # pid -> (read at, create time, cpu seconds, cpu ratio, resident bytes)
        self._host: dict[int, tuple[float, float, float, float | None, int]] = {}
        self._clock = clock
        self._refresh = host_refresh

    def describe(self, pid: int, used: int | None, kind: str) -> ProcessSample:
        try:
            proc = psutil.Process(pid)
            create_time = proc.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            # Exited, or a pid from another PID namespace (container without hostPID).
            self._cache.pop(pid, None)
            self._host.pop(pid, None)
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
        sample = ProcessSample(
            pid=pid, name=cached[1], user=cached[2], create_time=cached[0],
            used_memory_bytes=used, type=kind,
        )
        host = self._host_figures(pid, proc, create_time)
        if host is not None:
            _, _, sample.cpu_seconds_total, sample.cpu_ratio, sample.resident_memory_bytes = host
        return sample

    def _host_figures(self, pid: int, proc: psutil.Process, create_time: float):
        now = self._clock()
        last = self._host.get(pid)
        if last is not None and last[1] == create_time and now - last[0] < self._refresh:
            return last
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                rss = proc.memory_info().rss
        except psutil.Error:
            return last if last is not None and last[1] == create_time else None
        seconds = round(cpu.user + cpu.system, 3)
        ratio = None
        if last is not None and last[1] == create_time and now > last[0]:
            ratio = round(max(0.0, seconds - last[2]) / (now - last[0]), 4)
        figures = (now, create_time, seconds, ratio, int(rss))
        self._host[pid] = figures
        return figures

    def forget_except(self, live: set[int]) -> None:
        for pid in [p for p in self._cache if p not in live]:
            del self._cache[pid]
        for pid in [p for p in self._host if p not in live]:
            del self._host[pid]
