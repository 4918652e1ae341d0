"""Recordings: JSON Lines of ticks (DESIGN.md §2), gzip when the name ends in .gz."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import msgspec

from gpuwatch.model import RecordingHeader, Tick
from gpuwatch.safetext import encode_json

FORMAT = "gpuwatch-recording"
MAX_HEADER_BYTES = 64 * 1024  # a header is ~100 bytes: never read a huge first line whole


class RecordingError(ValueError):
    pass


def _open(path: str, mode: str) -> IO[bytes]:
    if path.endswith(".gz"):
        import gzip  # only for compressed recordings

        return gzip.open(path, mode + "b")
    return open(path, mode + "b")


# A SIGKILL loses at most this much of a .gz recording (plus the tick being written); see
# benchmarks/recording_flush.py for what flushing more often costs in size and CPU.
GZIP_FLUSH_SECONDS = 4.0


class Recorder:
    """Appends one line per tick. Plain files are flushed every tick; gzip ones when
    `gzip_flush_seconds` of ticks have passed since the last flush (a sync flush per tick
    costs compression) and on close."""

    def __init__(self, path: str, host: str, interval_s: float,
                 gzip_flush_seconds: float = GZIP_FLUSH_SECONDS):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)  # created owner-only; reopened below through the right codec
        self.path = path
        self._f = _open(path, "w")
        self._enc = msgspec.json.Encoder()
        self._every_s = gzip_flush_seconds if path.endswith(".gz") else 0.0
        self._flushed_t: float | None = None
        header = RecordingHeader(host=host, interval_s=interval_s)
        self._f.write(self._enc.encode(header) + b"\n")
        self._f.flush()

    def write(self, tick: Tick) -> None:
        self._f.write(encode_json(self._enc, tick) + b"\n")
        if self._flushed_t is None or tick.t - self._flushed_t >= self._every_s:
            self._f.flush()
            self._flushed_t = tick.t

    def close(self) -> None:
        self._f.close()


@dataclass
class ReadReport:
    """What reading a recording found, filled in as its ticks are iterated."""

    ticks: int = 0
    last_t: float | None = None
    # Where and why the recording stops short (a crash mid-write), or None when it is whole.
    cut: str | None = None


def _header(first: bytes, path: str) -> RecordingHeader:
    """Line 1 must be a recording header: an events log or any other JSON is refused."""
    if not first.strip():
        raise RecordingError(f"{path}: empty file, not a gpuwatch recording")
    try:
        raw = msgspec.json.decode(first)
    except msgspec.DecodeError as exc:
        raise RecordingError(f"{path}: line 1: not a gpuwatch recording header: {exc}") from None
    if not isinstance(raw, dict) or "format" not in raw:
        hint = " (it looks like an events log)" if isinstance(raw, dict) and (
            "signal" in raw or "action" in raw) else ""
        raise RecordingError(f"{path}: line 1: not a gpuwatch recording header: no "
                             f"\"format\": \"{FORMAT}\"{hint}")
    try:
        header = msgspec.convert(raw, RecordingHeader)
    except msgspec.ValidationError as exc:
        raise RecordingError(f"{path}: line 1: bad recording header: {exc}") from None
    if header.format != FORMAT:
        raise RecordingError(f"{path}: line 1: format is {header.format!r}, not {FORMAT!r}")
    if header.version != 1:
        raise RecordingError(f"{path}: recording version {header.version} is not supported")
    return header


def read_recording(path: str, report: ReadReport | None = None
                   ) -> tuple[RecordingHeader, Iterator[Tick]]:
    """The header and an iterator of ticks. A torn last line (a crash mid-write) ends the
    recording and is noted in `report.cut`; a bad line elsewhere is an error naming its line
    number."""
    try:
        f = _open(path, "r")
        first = f.readline(MAX_HEADER_BYTES)
    except (OSError, EOFError) as exc:
        raise RecordingError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        header = _header(first, path)
    except RecordingError:
        f.close()
        raise
    return header, _ticks(f, path, report if report is not None else ReadReport())


def _ticks(f: IO[bytes], path: str, report: ReadReport) -> Iterator[Tick]:
    dec = msgspec.json.Decoder(Tick)
    with f:
        pending: tuple[int, Exception] | None = None
        lines = enumerate(f, start=2)
        n = 1
        while True:
            try:
                n, line = next(lines)
            except StopIteration:
                if pending is not None:
                    report.cut = f"line {pending[0]} is torn (written partly)"
                return
            except EOFError:  # gzip cut short by a crash: no trailer
                report.cut = f"the compressed stream ends without its trailer after line {n}"
                return
            if pending is not None:
                raise RecordingError(f"{path}: line {pending[0]}: {pending[1]}")
            if not line.strip():
                continue
            try:
                tick = dec.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                pending = (n, exc)  # fatal unless it was the last line
                continue
            report.ticks += 1
            report.last_t = tick.t
            yield tick
