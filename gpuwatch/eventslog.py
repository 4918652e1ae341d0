"""The events log: one JSON event per line, appended; it outlives a full disk.

When a write fails (ENOSPC, EFBIG, EIO), the lines wait in a bounded queue and the log keeps
trying, at most once per `retry_seconds`. Once a write succeeds, the queue is written in order
and the gap is reported: how long it lasted, how many lines were held, how many were dropped
because the queue was full (the oldest go first). A line cut short by the disk is completed,
never duplicated or left torn.
"""

from __future__ import annotations

import collections
import logging
import os
import time

log = logging.getLogger("gpuwatch")

MAX_PENDING = 10_000


class EventsLog:
    def __init__(self, path: str, max_pending: int = MAX_PENDING,
                 retry_seconds: float = 1.0, clock=time.monotonic) -> None:
        self.path = path
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):  # /var/log/gpuwatch outside the unit's LogsDirectory=
            os.mkdir(parent, 0o750)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._pending: collections.deque[bytes] = collections.deque(maxlen=max_pending)
        # The rest of a line the disk cut short: never dropped, or the file would hold a
        # torn line.
        self._partial = b""
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._failed_at: float | None = None  # start of the current gap
        self._last_try = 0.0
        self._dropped_before = 0
        self.dropped = 0  # lines lost to a full queue, over the daemon's life

    @property
    def pending(self) -> int:
        return len(self._pending) + bool(self._partial)

    def write(self, line: str) -> None:
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1
        self._pending.append(line.encode() + b"\n")
        if self._failed_at is None or self._due():
            self._drain()

    def retry(self) -> None:
        """Called every tick: resumes writing once there is room again."""
        if self.pending and self._due():
            self._drain()

    def _due(self) -> bool:
        return self._clock() - self._last_try >= self._retry_seconds

    def _drain(self) -> None:
        self._last_try = self._clock()
        queued = self.pending
        while self._partial or self._pending:
            data = self._partial or self._pending.popleft()
            try:
                n = os.write(self._fd, data)
            except OSError as exc:
                n = 0
                self._fail(exc)
            self._partial = data[n:]
            if self._partial:
                if n:  # the disk filled mid-line: the rest goes first next time
                    self._fail(OSError("short write"))
                return
        if self._failed_at is not None:
            log.warning("events log %s resumed after a gap of %.1f s: %d events held and "
                        "written now, %d dropped (queue full)", self.path,
                        self._clock() - self._failed_at, queued,
                        self.dropped - self._dropped_before)
            self._failed_at = None

    def _fail(self, exc: OSError) -> None:
        if self._failed_at is None:
            self._failed_at, self._dropped_before = self._clock(), self.dropped
            log.error("events log %s: write failed (%s); holding up to %d events in memory "
                      "and retrying", self.path, exc.strerror or exc, self._pending.maxlen)

    def close(self) -> None:
        self._drain()
        if self.pending:
            log.error("events log %s: %d events could not be written at exit", self.path,
                      self.pending)
        os.close(self._fd)
