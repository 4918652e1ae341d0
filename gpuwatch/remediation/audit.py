"""The append-only audit log: one JSON object per line, fsynced per record, rotated by size.

Each record is written with a single write() on an O_APPEND descriptor and fsynced before
the call returns, so after a crash at most the last line is torn; the next writer starts a
fresh line and readers skip what does not parse.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()


class AuditLog:
    def __init__(self, path: str | os.PathLike, max_bytes: int = 16 * 1024**2,
                 backups: int = 5) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._fd: int | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._open()

    def _open(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise
        size = os.fstat(fd).st_size
        if size and not _ends_with_newline(self.path, size):
            os.write(fd, b"\n")  # a torn last line from a crash stays on its own line
            os.fsync(fd)
        self._fd = fd

    def write(self, record: dict[str, Any]) -> None:
        line = _encoder.encode(record) + b"\n"
        with self._lock:
            if self._fd is None:
                raise ValueError("audit log is closed")
            if self.max_bytes and os.fstat(self._fd).st_size + len(line) > self.max_bytes:
                self._rotate()
            os.write(self._fd, line)
            os.fsync(self._fd)

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

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


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
