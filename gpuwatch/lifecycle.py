"""What bounds the daemon's life: one daemon per state directory, file reads that may hang
(a FIFO, a stuck network filesystem) kept off the threads that exit waits for, and a
deadline on stopping."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

log = logging.getLogger("gpuwatch")

T = TypeVar("T")

LOCK_NAME = "daemon.lock"
# A daemon exits within STOP_DEADLINE_SECONDS of SIGTERM, so one that starts while the
# previous one stops waits that long for the lock before it gives up.
STOP_DEADLINE_SECONDS = 10.0
LOCK_WAIT_SECONDS = STOP_DEADLINE_SECONDS


# glibc's mallopt parameter (malloc.h)
M_ARENA_MAX = -8


def fewer_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas before the daemon starts its threads. glibc gives each
    thread that allocates an arena of its own (64 MiB reserved, a few hundred KiB
    resident that it keeps); the daemon's threads run under the GIL almost all the time
    and gain nothing from them. An operator's MALLOC_ARENA_MAX wins; False where the C
    library has no mallopt (musl)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes  # already loaded by the probe reader's statx

    try:
        return bool(ctypes.CDLL(None).mallopt(M_ARENA_MAX, arenas))
    except (AttributeError, OSError):
        return False


def trim_heap() -> bool:
    """Give the heap's free pages back to the kernel (glibc's malloc_trim): what startup
    parsed, NVML's initialisation and the first renders freed stays resident otherwise,
    since glibc returns only the top of a heap by itself. ctypes drops the GIL for the call;
    False where the C library has none (musl)."""
    import ctypes

    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (AttributeError, OSError):
        return False


class StateDirBusy(Exception):
    """Another live daemon holds the state directory; the message is one line."""


def lock_state_dir(directory: Path, wait: float = LOCK_WAIT_SECONDS) -> int | None:
    """An exclusive lock on the state directory, held by the returned descriptor until the
    process exits (the kernel drops it on any exit, SIGKILL included: no stale lock).
    None when the directory cannot be written at all, since then nothing of ours can mix in
    it. Raises StateDirBusy naming the holder's pid when it is still held after `wait`."""
    path = directory / LOCK_NAME
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        log.warning("state directory %s: cannot take its lock (%s); two daemons on it "
                    "would not be told apart", directory, exc.strerror or exc)
        return None
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fd)
                os.close(fd)
                raise StateDirBusy(
                    f"state directory {directory} is in use by another gpuwatch daemon "
                    f"({holder}); stop it, or give this one its own state directory "
                    "(STATE_DIRECTORY)") from None
            time.sleep(0.2)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).split()[0])
        return f"pid {pid}"
    return "pid unknown"


class StuckRead(Exception):
    """A previous read on a thread has not returned yet."""


class DeadlineReader:
    """Runs a blocking read on a daemon thread of its own, with a deadline. A read that never
    returns (open() on a FIFO, a dead NFS server) is left behind: daemon threads do not hold
    up exit, and while one is stuck, further reads are refused instead of stacking up
    threads."""

    def __init__(self) -> None:
        self._stuck: threading.Thread | None = None
        self._stuck_since = 0.0

    async def run(self, fn: Callable[[], T], timeout: float) -> T:
        if self._stuck is not None:
            if self._stuck.is_alive():
                raise StuckRead(f"a previous read has not returned for "
                                f"{time.monotonic() - self._stuck_since:.0f} s")
            self._stuck = None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def deliver(ok: bool, value) -> None:
            if not fut.done():
                (fut.set_result if ok else fut.set_exception)(value)

        def target() -> None:
            try:
                value = fn()
            except BaseException as exc:  # handed to the awaiting coroutine
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                    loop.call_soon_threadsafe(deliver, False, exc)
            else:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(deliver, True, value)

        thread = threading.Thread(target=target, name="gpuwatch-read", daemon=True)
        started = time.monotonic()
        thread.start()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            self._stuck, self._stuck_since = thread, started
            raise


def exit_after(seconds: float, status: int) -> threading.Thread:
    """Arms the stop deadline: unless the process has exited by then, it exits with `status`
    (os._exit: no thread, executor or atexit hook can hold it up). A daemon thread."""

    def watchdog() -> None:
        time.sleep(seconds)
        with contextlib.suppress(Exception):
            log.error("still stopping after %.0f s: exiting now", seconds)
            for handler in logging.getLogger().handlers:
                handler.flush()
        with contextlib.suppress(Exception):  # the engine readers' processes go with it
            import multiprocessing

            for child in multiprocessing.active_children():
                child.kill()
        os._exit(status)

    thread = threading.Thread(target=watchdog, name="gpuwatch-stop-deadline", daemon=True)
    thread.start()
    return thread
