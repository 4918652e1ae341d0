"""Join NVML's pids with what the host knows about them: name, user, start time, and (as nvitop
shows next to GPU memory) CPU time and resident memory.

Names and users are bytes any user chooses (prctl, a binary's file name, /etc/passwd):
they enter the sample as valid text (gpuwatch.safetext.valid)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import psutil

from gpuwatch.model import ProcessSample
from gpuwatch.remediation.identity import start_ticks
from gpuwatch.safetext import valid

# CPU and resident memory are read again after this long: two /proc reads per process,
# cheap for a few, not for hundreds on every 1 s tick.
HOST_REFRESH_SECONDS = 5.0


class _Known(NamedTuple):
    ticks: int  # start time in clock ticks: a reused pid is another process
    proc: psutil.Process
    create_time: float
    name: str
    user: str


def _start_ticks(pid: int) -> int | None:
    try:
        return start_ticks(pid)
    except (OSError, ValueError, IndexError):  # hidden (hidepid), or no such process
        return None


class ProcessInfo:
    """Caches psutil lookups by pid. Each sample costs one read of /proc/<pid>/stat (the
    start time, which tells a reused pid from the process seen before); names, users and the
    psutil handle are looked up once per process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 host_refresh: float = HOST_REFRESH_SECONDS) -> None:
        self._known: dict[int, _Known] = {}
        # pid -> (read at, create time, cpu seconds, cpu ratio, resident bytes)
        self._host: dict[int, tuple[float, float, float, float | None, int]] = {}
        self._clock = clock
        self._refresh = host_refresh

    def describe(self, pid: int, used: int | None, kind: str) -> ProcessSample:
        ticks = _start_ticks(pid)
        known = self._known.get(pid)
        if known is None or known.ticks != ticks:
            known = self._look_up(pid, ticks)
            if known is None:
                # Exited, or a pid from another PID namespace (container without hostPID).
                self._known.pop(pid, None)
                self._host.pop(pid, None)
                return ProcessSample(pid=pid, used_memory_bytes=used, type=kind)
        sample = ProcessSample(
            pid=pid, name=known.name, user=known.user, create_time=known.create_time,
            used_memory_bytes=used, type=kind,
        )
        host = self._host_figures(pid, known.proc, known.create_time)
        if host is not None:
            _, _, sample.cpu_seconds_total, sample.cpu_ratio, sample.resident_memory_bytes = host
        return sample

    def _look_up(self, pid: int, ticks: int | None) -> _Known | None:
        if ticks is None:
            return None
        try:
            proc = psutil.Process(pid)
            create_time = proc.create_time()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            return None
        name = user = ""
        try:
            with proc.oneshot():
                name = valid(proc.name())
                user = valid(proc.username())
        except (psutil.Error, KeyError):
            pass  # KeyError: uid without a passwd entry
        known = _Known(ticks, proc, create_time, name, user)
        self._known[pid] = known
        return known

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
        for pid in [p for p in self._known if p not in live]:
            del self._known[pid]
        for pid in [p for p in self._host if p not in live]:
            del self._host[pid]
