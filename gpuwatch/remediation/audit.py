"""The append-only audit log: one JSON object per line, rotated by size.

Records are queued and a writer thread appends them in batches, one write() and one fsync per
batch, so a burst of decisions (one Alertmanager notification can carry thousands of alerts)
costs the event loop nothing but the queueing. submit() returns a future that is done once
the record is on disk; write() waits for it.

When the disk is full the writer keeps the records in a bounded queue and retries; once a
write succeeds again it first writes an `audit_gap` note saying since when it failed and how
many records the queue could not keep. A record that must be on disk before something may
happen (an action's "started") fails at once instead of waiting, and is not written later.

Each batch goes out with write() calls on an O_APPEND descriptor; a batch that fails part way
is cut back off the file, and after a crash at most the last line is torn: the next writer
starts a fresh line and readers skip what does not parse.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from gpuwatch.safetext import encode_json

_encoder = msgspec.json.Encoder()

MAX_QUEUE = 10_000
MAX_BATCH = 4096
RETRY_SECONDS = 1.0


class _Item:
    __slots__ = ("durable", "future", "line")

    def __init__(self, line: bytes, durable: bool) -> None:
        self.line = line
        self.durable = durable
        self.future: concurrent.futures.Future[None] = concurrent.futures.Future()


class AuditLog:
    def __init__(self, path: str | os.PathLike, max_bytes: int = 16 * 1024**2,
                 backups: int = 5, *, max_queue: int = MAX_QUEUE,
                 retry_seconds: float = RETRY_SECONDS, clock=time.time) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.max_queue = max_queue
        self.retry_seconds = retry_seconds
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: collections.deque[_Item] = collections.deque()
        self._busy = False  # the writer holds a batch taken off the queue
        self._closing = False
        self._fd: int | None = None
        # Outage bookkeeping, reported in the gap note once writing works again.
        self.failing_since: float | None = None
        self.last_error = ""
        self.dropped = 0
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._open()
        self._thread = threading.Thread(target=self._run, name="gpuwatch-audit", daemon=True)
        self._thread.start()

    # -- the callers' side ------------------------------------------------------------------

    def submit(self, record: dict[str, Any], *, durable: bool = False
               ) -> concurrent.futures.Future[None]:
        """Queue a record; the future is done once it is on disk. durable: fail the future at
        once when the log cannot be written (the record is then never written), instead of
        keeping it queued until the disk has room."""
        item = _Item(encode_json(_encoder, record) + b"\n", durable)
        with self._cond:
            if self._closing:
                raise ValueError("audit log is closed")
            if len(self._queue) >= self.max_queue:
                self._drop_oldest()
            self._queue.append(item)
            self._cond.notify()
        return item.future

    def write(self, record: dict[str, Any], timeout: float | None = None) -> None:
        """Append a record and wait until it is on disk; raises OSError when it cannot be."""
        self.submit(record, durable=True).result(timeout)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued record is written (or given up); True when none is left."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or (self.failing_since is not None and not self._busy):
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (waiting at most timeout seconds), then stop the writer."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            for item in self._queue:
                if not item.future.done():
                    item.future.set_exception(OSError(f"audit log closed: {self.last_error}"))
            self._queue.clear()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    @property
    def queued(self) -> int:
        return len(self._queue)

    # -- the writer thread --------------------------------------------------------------------

    def _drop_oldest(self) -> None:
        """Make room: the oldest record that nobody waits on goes (counted in the gap)."""
        for i, item in enumerate(self._queue):
            if not item.durable:
                del self._queue[i]
                break
        else:
            item = self._queue.popleft()
        self.dropped += 1
        item.future.set_exception(OSError("audit queue full: record dropped"))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue),
                                                                   MAX_BATCH))]
                self._busy = True
            try:
                self._write_batch(batch)
            except Exception as exc:  # OSError, or anything else: never lose the thread
                self._failed([item for item in batch if not item.future.done()], exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _failed(self, batch: list[_Item], exc: Exception) -> None:
        with self._cond:
            if self.failing_since is None:
                self.failing_since = self.clock()
            self.last_error = f"{type(exc).__name__}: {exc}"
            keep = []
            for item in batch:
                if item.durable:
                    item.future.set_exception(exc if isinstance(exc, OSError)
                                              else OSError(self.last_error))
                else:
                    keep.append(item)
            self._queue.extendleft(reversed(keep))  # their order, ahead of newer records
            while len(self._queue) > self.max_queue:
                self._drop_oldest()
            if self._closing:  # stopping with the disk still full: nothing more can be kept
                for item in self._queue:
                    item.future.set_exception(OSError(self.last_error))
                self._queue.clear()
                return
            self._busy = False
            self._cond.notify_all()
            self._cond.wait(self.retry_seconds)  # woken early by close()

    def _write_batch(self, batch: list[_Item]) -> None:
        """Append the batch in groups that fit the rotation size, one fsync per group; the
        records of a group are done once it is on disk."""
        if self._fd is None:
            self._open()
        head = b""
        if self.failing_since is not None:
            gap = {"t": self.clock(), "note": "audit_gap", "failing_since": self.failing_since,
                   "error": self.last_error, "dropped": self.dropped}
            head = _encoder.encode(gap) + b"\n"
        size = os.fstat(self._fd).st_size
        group: list[_Item] = []
        group_bytes = len(head)
        for item in batch:
            if (self.max_bytes and group and size + group_bytes + len(item.line) > self.max_bytes):
                self._append(head, group)
                head, group, group_bytes = b"", [], 0
                size = os.fstat(self._fd).st_size
            group.append(item)
            group_bytes += len(item.line)
        self._append(head, group)

    def _append(self, head: bytes, group: list[_Item]) -> None:
        data = head + b"".join(item.line for item in group)
        if self.max_bytes and os.fstat(self._fd).st_size + len(data) > self.max_bytes:
            self._rotate()
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):  # no torn group in the middle of the log
                os.ftruncate(self._fd, start)
            raise
        if self.failing_since is not None:
            self.failing_since, self.dropped, self.last_error = None, 0, ""
        for item in group:
            if not item.future.done():
                item.future.set_result(None)

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise
        size = os.fstat(fd).st_size
        if size and not _ends_with_newline(self.path, size):
            os.write(fd, b"\n")  # a torn last line from a crash stays on its own line
            os.fsync(fd)
        self._fd = fd

    def _rotate(self) -> None:
        os.close(self._fd)
        self._fd = None
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for i in range(self.backups - 1, 0, -1):
                src = self.path.with_name(f"{self.path.name}.{i}")
                if src.exists():
                    os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        self._open()
        _fsync_dir(self.path.parent)


def _ends_with_newline(path: Path, size: int) -> bool:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1) == b"\n"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The records of one audit file, oldest first; torn or foreign lines are skipped."""
    with open(path, "rb") as f:
        for raw in f:
            try:
                rec = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                continue
            if isinstance(rec, dict):
                yield rec
