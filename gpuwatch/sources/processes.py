"""Join NVML's pids with what the host knows about them: name, user, start time, and (as nvitop
shows next to GPU memory) CPU time and resident memory.

Names and users are bytes any user chooses (prctl, a binary's file name, /etc/passwd):
they enter the sample as valid text (gpuwatch.safetext.valid)."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import time
from collections.abc import Callable
from typing import NamedTuple

import psutil

from gpuwatch.model import ProcessSample
from gpuwatch.remediation.identity import pidfd_supported, start_ticks
from gpuwatch.safetext import valid

# CPU and resident memory are read again after this long: two /proc reads per process,
# cheap for a few, not for hundreds on every 1 s tick.
HOST_REFRESH_SECONDS = 5.0
# Processes followed through a pidfd (one descriptor each); past it, through their start time.
MAX_PIDFDS = 128


class _Known(NamedTuple):
    ticks: int  # start time in clock ticks: a reused pid is another process
    proc: psutil.Process
    create_time: float
    name: str
    user: str
    fd: int | None  # a pidfd of this very process, where one is held


def _start_ticks(pid: int) -> int | None:
    try:
        return start_ticks(pid)
    except (OSError, ValueError, IndexError):  # hidden (hidepid), or no such process
        return None


def _exited(fd: int) -> bool:
    """Whether the process a pidfd refers to has exited (it polls readable then)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


def _close(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


class ProcessInfo:
    """Caches psutil lookups by pid: names, users and the psutil handle are looked up once
    per process. Whether a pid still names the process seen before (a reused pid is another
    one) is asked of a pidfd held for it, one poll per sample, or where there is none (no
    pidfd support, more than MAX_PIDFDS processes) of its start time in /proc/<pid>/stat,
    one read per sample."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 host_refresh: float = HOST_REFRESH_SECONDS,
                 max_pidfds: int = MAX_PIDFDS) -> None:
        self._known: dict[int, _Known] = {}
        # pid -> (read at, create time, cpu seconds, cpu ratio, resident bytes)
        self._host: dict[int, tuple[float, float, float, float | None, int]] = {}
        self._clock = clock
        self._refresh = host_refresh
        self._max_fds = max_pidfds if pidfd_supported() else 0
        self._fds = 0
        self._exits: dict[int, bool] = {}  # pid -> exited, from poll_exits

    def describe(self, pid: int, used: int | None, kind: str) -> ProcessSample:
        known = self._known.get(pid)
        if known is None or not self._same(known, pid):
            self._forget(pid)
            known = self._look_up(pid)
            if known is None:
                # Exited, or a pid from another PID namespace (container without hostPID).
                return ProcessSample(pid=pid, used_memory_bytes=used, type=kind)
        sample = ProcessSample(
            pid=pid, name=known.name, user=known.user, create_time=known.create_time,
            used_memory_bytes=used, type=kind,
        )
        host = self._host_figures(pid, known.proc, known.create_time)
        if host is not None:
            _, _, sample.cpu_seconds_total, sample.cpu_ratio, sample.resident_memory_bytes = host
        return sample

    def poll_exits(self) -> None:
        """Once per sample, before describe(): one poll for every pidfd held, not one each."""
        self._exits = {}
        fds = {k.fd: pid for pid, k in self._known.items() if k.fd is not None}
        if not fds:
            return
        p = select.poll()
        for fd in fds:
            p.register(fd, select.POLLIN)
        try:
            ready = {fds[fd] for fd, _ in p.poll(0)}
        except OSError:
            return  # each asks its own then
        self._exits = {pid: pid in ready for pid in fds.values()}

    def _same(self, known: _Known, pid: int) -> bool:
        if known.fd is not None:
            exited = self._exits.pop(pid, None)  # this sample's poll, used once
            if exited is None:
                try:
                    exited = _exited(known.fd)
                except (OSError, ValueError):
                    return False
            return not exited
        return _start_ticks(pid) == known.ticks

    def _look_up(self, pid: int) -> _Known | None:
        fd = None
        if self._fds < self._max_fds:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                return None
            except OSError as exc:  # out of descriptors, or unsupported here (a sandbox)
                if exc.errno in (errno.ENOSYS, errno.EPERM):
                    self._max_fds = 0  # not asked again: the start time serves
        # read after the pidfd is open: whatever it refers to is the process read here
        ticks = _start_ticks(pid)
        known = None
        if ticks is not None:
            try:
                proc = psutil.Process(pid)
                create_time = proc.create_time()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess,
                    ValueError):
                pass
            else:
                name = user = ""
                try:
                    with proc.oneshot():
                        name = valid(proc.name())
                        user = valid(proc.username())
                except (psutil.Error, KeyError):
                    pass  # KeyError: uid without a passwd entry
                known = _Known(ticks, proc, create_time, name, user, fd)
        if known is None:
            _close(fd)
            return None
        if fd is not None:
            self._fds += 1
        self._known[pid] = known
        return known

    def _forget(self, pid: int) -> None:
        known = self._known.pop(pid, None)
        self._host.pop(pid, None)
        if known is not None and known.fd is not None:
            _close(known.fd)
            self._fds -= 1

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
            self._forget(pid)
        for pid in [p for p in self._host if p not in live]:
            del self._host[pid]

    def close(self) -> None:
        for pid in list(self._known):
            self._forget(pid)
