"""The OOM flight recorder inside the host process: PyTorch's out-of-memory observer keeps what
the caching allocator held at the moment a request failed (gpuwatch.probe_channel.oom).

torch calls the observer on the allocating thread, with the GIL, after it has released what
it could and just before it raises OutOfMemoryError: the allocator's state is then exactly
what made the request fail, and gone a moment later as the program unwinds. So the record is
taken there, at the first failed request of a burst, and written at once (rename, no fsync:
it must outlive the process, not the machine). Calls that follow within oom_burst_seconds
are the same OOM (cuDNN retries with smaller workspaces). The probe's thread rewrites the
record once the burst is over, with what became of it:

  * where sys.monitoring exists (Python 3.12+) the recorder watches, while a burst is open,
    whether an OutOfMemoryError reaches Python code and whether some code catches it: a
    failure that never reaches the program was absorbed by a retry inside torch or a
    library (recovered); one that does is raised, or caught when the program handles it and
    goes on. The watch holds a monitoring tool id only while open;
  * without it the outcome is unknown, and `exited` says whether the process ended before
    the burst was over.

Bounds: oom_max_records records and oom_max_bytes on disk per process, a record of at most
MAX_RECORD_BYTES, at most MAX_BLOCKS blocks summarised. The observer never raises into the
allocator (an exception there would replace the OutOfMemoryError), and torch cannot detach
an observer: after stop() it does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from gpuwatch.probe_agent.oom_summary import stats_subset, summarize
from gpuwatch.probe_agent.stats import AllocatorReader
from gpuwatch.probe_channel import oom as fmt
from gpuwatch.probe_channel import protocol
from gpuwatch.probe_channel.config import ProbeConfig

log = logging.getLogger("gpuwatch.probe")

MAX_REQUESTS_KEPT = 16
LOCK_TIMEOUT_SECONDS = 1.0


class RaiseWatch:
    """While open, notes whether an exception of `types` reaches Python code, and whether
    Python code catches it (sys.monitoring RAISE / EXCEPTION_HANDLED, Python 3.12+)."""

    TOOL_IDS = (3, 4)  # not among the ids sys.monitoring reserves (debugger, coverage, ...)

    def __init__(self, types: tuple[type, ...]) -> None:
        self.types = types
        self.tool: int | None = None
        self.raised = False
        self.handled = False

    @property
    def supported(self) -> bool:
        return hasattr(sys, "monitoring") and bool(self.types)

    def open(self, reset: bool = True) -> bool:
        """Start watching (reset: from a clean slate); False where it cannot (no
        sys.monitoring, no free id)."""
        if reset:
            self.raised = self.handled = False
        if self.tool is not None:
            return True
        mon = getattr(sys, "monitoring", None)
        if mon is None or not self.types:
            return False
        for tool in self.TOOL_IDS:
            try:
                mon.use_tool_id(tool, "gpuwatch-probe-oom")
            except ValueError:
                continue
            ev = mon.events
            mon.register_callback(tool, ev.RAISE, self._on_raise)
            mon.register_callback(tool, ev.EXCEPTION_HANDLED, self._on_handled)
            mon.set_events(tool, ev.RAISE | ev.EXCEPTION_HANDLED)
            self.tool = tool
            return True
        return False

    def close(self) -> None:
        tool, self.tool = self.tool, None
        if tool is None:
            return
        mon = sys.monitoring
        with contextlib.suppress(Exception):
            mon.set_events(tool, 0)
            mon.register_callback(tool, mon.events.RAISE, None)
            mon.register_callback(tool, mon.events.EXCEPTION_HANDLED, None)
        with contextlib.suppress(Exception):
            mon.free_tool_id(tool)

    # Called for every exception of every thread while open: nothing but a type check.
    def _on_raise(self, code: Any, offset: int, exc: BaseException) -> None:
        if isinstance(exc, self.types):
            self.raised = True

    def _on_handled(self, code: Any, offset: int, exc: BaseException) -> None:
        if isinstance(exc, self.types):
            self.handled = True


@dataclass
class _Burst:
    record: fmt.OomRecord
    watched: bool  # the raise watch was open from its first call
    files: dict[str, int] = field(default_factory=dict)  # name -> bytes on disk
    # when the observer last returned: a burst ends that long after the allocator got back
    # control, not after the call began (dumping the history can take longer than the burst,
    # and the error only reaches Python once the observer has returned)
    quiet_from: float = 0.0


class _Capped:
    """A file that refuses to grow past `left` bytes (a history pickle under the cap)."""

    def __init__(self, f: BinaryIO, left: int) -> None:
        self.f, self.left = f, left

    def write(self, data: bytes) -> int:
        self.left -= len(data)
        if self.left < 0:
            raise OverflowError("over the per-process OOM byte cap")
        return self.f.write(data)


class OomRecorder:
    """One per process. `open_dir()` returns a descriptor on the probe's own directory (the
    caller closes nothing: the recorder closes what it gets)."""

    def __init__(self, torch: Any, config: ProbeConfig, pid: int, create_time: float | None,
                 open_dir, on_record=None, clock=time.time) -> None:
        self.torch = torch
        self.cfg = config
        self.pid = pid
        self.create_time = create_time
        self._open_dir = open_dir
        self._on_record = on_record
        self._clock = clock
        self.reader = AllocatorReader(torch)
        self.watch = RaiseWatch(_oom_types(torch))
        self._lock = threading.Lock()
        self._bursts: dict[int, _Burst] = {}
        self._totals: dict[int, int | None] = {}
        self.active = True
        self.records = 0  # written in this process's life
        self.bytes_on_disk = 0
        self.dropped = 0  # OOMs past the caps, or that could not be written
        self.missed = 0  # calls that found the recorder busy past LOCK_TIMEOUT_SECONDS
        self.last_capture_seconds: float | None = None
        self.errors: list[str] = []

    # -- the observer (host thread) -------------------------------------------------------
    def on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """torch's OOM observer; never raises."""
        try:
            if not self.active:
                return
            w0 = time.perf_counter()
            t = self._clock()
            if not self._lock.acquire(timeout=LOCK_TIMEOUT_SECONDS):
                self.missed += 1
                return
            try:
                new = self._record_call(int(device), int(alloc), int(device_alloc),
                                        int(device_free), t, w0)
            finally:
                self._lock.release()
            if new and self._on_record is not None:
                self._on_record()
        except Exception as exc:  # never into the allocator
            self._error(f"observer: {type(exc).__name__}: {exc}")

    def _record_call(self, device: int, alloc: int, cap: int, free: int, t: float,
                     w0: float) -> bool:
        burst = self._bursts.get(device)
        if burst is not None:
            rec = burst.record
            if t - (rec.last_t or rec.t) <= self.cfg.oom_burst_seconds:
                rec.observer_calls += 1
                rec.last_t = t
                if len(rec.requests) < MAX_REQUESTS_KEPT:
                    rec.requests.append(alloc)
                burst.quiet_from = self._clock()
                return False
            self._finalize(device, exited=False)
        if self.records >= self.cfg.oom_max_records or (
                self.bytes_on_disk >= self.cfg.oom_max_bytes):
            self.dropped += 1
            return False
        rec = self._capture(device, alloc, cap, free, t)
        burst = _Burst(rec, watched=False)
        if not self._write(burst, new=True):
            self.dropped += 1
            return False
        burst.watched = self.watch.open(reset=not self._bursts)
        if not burst.watched and self.watch.supported:
            rec.notes.append("no free sys.monitoring tool id: the outcome is not watched")
        self._bursts[device] = burst
        self.records += 1
        if self.cfg.oom_history and self._history_on():
            self._dump_history(burst)
        rec.capture_seconds = round(time.perf_counter() - w0, 6)
        self.last_capture_seconds = rec.capture_seconds
        burst.quiet_from = self._clock()
        return True

    def _capture(self, device: int, alloc: int, cap: int, free: int,
                 t: float) -> fmt.OomRecord:
        cuda = self.torch.cuda
        notes: list[str] = []
        try:
            stats = cuda.memory_stats(device)
        except Exception as exc:
            stats, notes = {}, [f"memory_stats: {type(exc).__name__}: {exc}"[:200]]
        try:
            summary = summarize(self.reader.segments(), device, stats)
        except Exception as exc:
            summary = fmt.AllocatorSummary()
            notes.append(f"memory_snapshot: {type(exc).__name__}: {exc}"[:200])
        total = self._total(device)
        # torch passes the per-process cap in place of the total when one is set
        allowed = cap if total is not None and 0 < cap < total else None
        reserved = stats.get("reserved_bytes.all.current")
        return fmt.OomRecord(
            pid=self.pid, seq=self.records + 1, create_time=self.create_time, t=t, last_t=t,
            device=device, gpu_uuid=self.reader.uuid(device),
            torch_version=str(getattr(self.torch, "__version__", ""))[:40],
            request_bytes=alloc, requests=[alloc], device_free_bytes=free,
            device_total_bytes=total, allowed_bytes=allowed,
            num_ooms=_int(stats.get("num_ooms")), stats=stats_subset(stats), summary=summary,
            cause=fmt.classify(alloc, free, summary.free_bytes,
                               reserved if isinstance(reserved, int) else None, allowed),
            notes=notes)

    def _total(self, device: int) -> int | None:
        if device not in self._totals:
            total = None
            with contextlib.suppress(Exception):
                total = int(self.torch.cuda.mem_get_info(device)[1])
            if total is None:
                with contextlib.suppress(Exception):
                    total = int(self.torch.cuda.get_device_properties(device).total_memory)
            self._totals[device] = total
        return self._totals[device]

    def _history_on(self) -> bool:
        probe = getattr(self.torch._C, "_cuda_isHistoryEnabled", None)
        try:
            return bool(probe()) if probe is not None else False
        except Exception:
            return False

    def _dump_history(self, burst: _Burst) -> None:
        rec = burst.record
        name = fmt.history_name(self.pid, rec.seq)
        left = self.cfg.oom_max_bytes - self.bytes_on_disk
        try:
            snap = self.torch.cuda.memory._snapshot()
            with self._dir() as fd:
                protocol.write_atomic(fd, name, lambda f: pickle.dump(snap, _Capped(f, left)),
                                      sync=False)
                size = os.stat(name, dir_fd=fd, follow_symlinks=False).st_size
        except OverflowError:
            rec.notes.append(f"allocation history not kept: more than the {left} bytes left "
                             "under oom_max_bytes")
        except Exception as exc:
            rec.notes.append(f"allocation history: {type(exc).__name__}: {exc}"[:200])
        else:
            burst.files[name] = size
            self.bytes_on_disk += size
            rec.history, rec.history_bytes = name, size
        self._write(burst)

    # -- writing ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _dir(self):
        fd = self._open_dir()
        try:
            yield fd
        finally:
            os.close(fd)

    def _write(self, burst: _Burst, new: bool = False) -> bool:
        """Write the record; a new one only if it fits under the byte cap (a rewrite may
        grow it by its outcome and notes)."""
        rec = burst.record
        name = fmt.record_name(self.pid, rec.seq)
        data = _bounded(rec)
        if new and self.bytes_on_disk + len(data) > self.cfg.oom_max_bytes:
            return False
        try:
            with self._dir() as fd:
                protocol.write_atomic(fd, name, data, sync=False)
        except Exception as exc:
            self._error(f"writing {name}: {type(exc).__name__}: {exc}")
            return False
        self.bytes_on_disk += len(data) - burst.files.get(name, 0)
        burst.files[name] = len(data)
        return True

    # -- the probe's thread ------------------------------------------------------------------
    def tick(self, now: float | None = None) -> None:
        """Finalise the bursts that are over; never raises."""
        now = self._clock() if now is None else now
        if not self._bursts:
            return
        try:
            with self._lock:
                for device in [d for d, b in self._bursts.items()
                               if now - max(b.quiet_from, b.record.last_t or b.record.t)
                               > self.cfg.oom_burst_seconds]:
                    self._finalize(device, exited=False)
        except Exception as exc:
            self._error(f"finalize: {type(exc).__name__}: {exc}")

    def close(self, exited: bool) -> None:
        """Finalise every open burst (at exit: `exited`), and do nothing from now on."""
        try:
            with self._lock:
                for device in list(self._bursts):
                    self._finalize(device, exited=exited)
                self.active = False
        except Exception as exc:
            self._error(f"close: {type(exc).__name__}: {exc}")

    def _finalize(self, device: int, exited: bool) -> None:
        burst = self._bursts.pop(device)
        rec = burst.record
        rec.final = True
        rec.exited = exited
        if burst.watched:
            if self.watch.raised:
                rec.outcome = "caught" if self.watch.handled and not exited else "raised"
            else:
                rec.outcome = "recovered"
        else:
            rec.outcome = "unknown"
        with contextlib.suppress(Exception):
            rec.num_ooms_after = _int(self.torch.cuda.memory_stats(device).get("num_ooms"))
        if not self._bursts:
            self.watch.close()
        self._write(burst)

    def _error(self, text: str) -> None:
        if len(self.errors) < 8:
            self.errors.append(text[:300])
            log.warning("gpuwatch probe: OOM record: %s", text)


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def _oom_types(torch: Any) -> tuple[type, ...]:
    found = []
    for holder in (torch, getattr(torch, "cuda", None)):
        exc = getattr(holder, "OutOfMemoryError", None)
        if isinstance(exc, type) and issubclass(exc, BaseException) and exc not in found:
            found.append(exc)
    return tuple(found)


def _bounded(rec: fmt.OomRecord) -> bytes:
    """The record's JSON, under MAX_RECORD_BYTES: the longest lists go first."""
    data = fmt.encode(rec)
    if len(data) <= fmt.MAX_RECORD_BYTES:
        return data
    s = rec.summary
    s.pools = s.pools[:fmt.TOP]
    rec.notes = [n[:200] for n in rec.notes[:8]]
    rec.requests = rec.requests[:4]
    return fmt.encode(rec)


# -- one observer per process ---------------------------------------------------------------
# torch has no way to detach an observer: one is attached per process, and forwards to the
# recorder of the probe running now (none after stop(), or in a forked child until its own
# probe starts).
_current: OomRecorder | None = None
_attached_pid: int | None = None


def _observer(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
    rec = _current
    if rec is not None and rec.pid == os.getpid():
        rec.on_oom(device, alloc, device_alloc, device_free)


def install(recorder: OomRecorder) -> str | None:
    """Route this process's OOM observer to `recorder`, attaching it to torch if not yet done
    in this process. Returns why it cannot be (an older torch), else None. The host must
    have initialised CUDA: attaching initialises it otherwise."""
    global _current, _attached_pid
    pid = os.getpid()
    if _attached_pid != pid:
        attach = getattr(recorder.torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return "this torch has no OOM observer (torch._C._cuda_attach_out_of_memory_observer)"
        attach(_observer)
        _attached_pid = pid
    _current = recorder
    return None


def uninstall(recorder: OomRecorder, exiting: bool = False) -> None:
    """Finish the recorder's open bursts (exiting: the process is ending) and detach it."""
    global _current
    if _current is recorder:
        recorder.close(exited=exiting)
        _current = None
