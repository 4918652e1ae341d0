"""Which process a pid is: its start time in clock ticks since boot (/proc/<pid>/stat field
22, exact, unlike a float create time compared with a tolerance), and pidfds taken when a
process is first seen on a GPU, so a signal can only ever reach that process.

A pidfd refers to one process for good: once it has exited, sending through the pidfd fails
with ESRCH even when its pid has been given to a new process. Where pidfds are missing
(Linux < 5.3, or a platform without os.pidfd_open) the start time is all there is; it tells
two processes apart unless both started within the same clock tick (10 ms at the usual
CLK_TCK of 100).
"""

from __future__ import annotations

import contextlib
import os
import signal as _signal
from collections.abc import Iterable

import psutil

PROC = "/proc"
# Each held pidfd is a descriptor: stay well under the usual soft limit of 1024.
MAX_HANDLES = 512

try:
    CLK_TCK = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # not Linux
    CLK_TCK = 100


def pidfd_supported() -> bool:
    return hasattr(os, "pidfd_open") and hasattr(_signal, "pidfd_send_signal")


def start_ticks(pid: int, proc_root: str = PROC) -> int | None:
    """The process's start time in clock ticks after boot; None when there is no such pid."""
    try:
        with open(f"{proc_root}/{int(pid)}/stat", "rb") as f:
            data = f.read(4096)
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm (field 2) may hold spaces and parentheses: the fields that follow start after
    # its last ')'. Field 22 is the 20th of those (fields 3..).
    rest = data[data.rindex(b")") + 2:].split()
    return int(rest[19])


def ticks_of(create_time: float) -> int:
    """Clock ticks after boot of a create time read through psutil (boot time + ticks/CLK_TCK,
    so the conversion back is exact)."""
    return round((create_time - psutil.boot_time()) * CLK_TCK)


def same_process(pid: int, create_time: float, proc_root: str = PROC) -> bool | None:
    """Is pid still the process that started at create_time? None when pid is gone."""
    ticks = start_ticks(pid, proc_root)
    if ticks is None:
        return None
    return ticks == ticks_of(create_time)


class ProcessHandles:
    """A pidfd for each (pid, create time) seen on a GPU, opened when first seen and checked
    then against the sampled start time; closed when the process is no longer sampled."""

    def __init__(self, max_handles: int = MAX_HANDLES, proc_root: str = PROC) -> None:
        self.max_handles = max_handles
        self.proc_root = proc_root
        # (pid, create_time) -> pidfd, or -1: the pid already belonged to another process
        # when first seen.
        self._fds: dict[tuple[int, float], int] = {}

    def observe(self, processes: Iterable[tuple[int, float | None]]) -> None:
        current = {(pid, ct) for pid, ct in processes if ct is not None}
        for key in [k for k in self._fds if k not in current]:
            self._close(key)
        if not pidfd_supported():
            return
        for key in current - self._fds.keys():
            if len(self._fds) >= self.max_handles:
                break
            fd = self._open(*key)
            if fd is not None:
                self._fds[key] = fd

    def _open(self, pid: int, create_time: float) -> int | None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return -1  # gone already: whatever has this pid later is not the sampled one
        except OSError:
            return None  # out of descriptors, or no pidfd support: the fall-back applies
        # Checked after opening: whatever the fd refers to is the process checked here.
        if same_process(pid, create_time, self.proc_root) is not True:
            os.close(fd)
            return -1
        return fd

    def dup(self, pid: int, create_time: float | None) -> int | None:
        """A descriptor of the pidfd taken when the process was first seen (the caller closes
        it); None when none is held. Raises LookupError when the pid had already been reused
        when first seen."""
        if create_time is None:
            return None
        fd = self._fds.get((pid, create_time))
        if fd is None:
            return None
        if fd < 0:
            raise LookupError(f"pid {pid} had exited, or was another process, when first "
                              "seen: pid reused")
        return os.dup(fd)

    def _close(self, key: tuple[int, float]) -> None:
        fd = self._fds.pop(key)
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close(self) -> None:
        for key in list(self._fds):
            self._close(key)

    def __len__(self) -> int:
        return len(self._fds)
