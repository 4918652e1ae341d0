"""The probe's background thread inside a PyTorch process.

Every `interval_seconds` it publishes the allocator's state as `<pid>.json` in its user's
probe directory, and every `request_poll_seconds` it looks for requests from the daemon
(flush, snapshot) and answers them.

Rules it keeps for its host:
  * it never imports torch and never initialises CUDA: it reads the torch module the host
    imported, and only once the host has initialised CUDA itself (a probe that initialised
    CUDA would break a host that forks workers later);
  * nothing it does raises into the host: every failure is logged once and retried;
  * its cost is bounded: when a publish took longer than `max_overhead_ratio` of the
    interval, the next one waits longer;
  * it stops cleanly: stop() (also run at exit) ends the thread and removes its record;
  * once CUDA is up it attaches torch's OOM observer (probe_agent/oom.py): an OOM leaves a
    record in the probe directory that outlives the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Any

import msgspec

from gpuwatch.probe_agent import actions
from gpuwatch.probe_agent import oom as oom_recorder
from gpuwatch.probe_agent.stats import AllocatorReader
from gpuwatch.probe_channel import protocol
from gpuwatch.probe_channel.config import ProbeConfig, resolve_dir

log = logging.getLogger("gpuwatch.probe")

_encoder = msgspec.json.Encoder()


def _own_create_time() -> float | None:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:
        return None


class WaitingForDaemon(OSError):
    """Our directory in the shared probe directory is not there yet: the root daemon makes
    it once this process shows up on a GPU."""


def open_own_dir(base: str) -> int:
    """A descriptor on `<base>/<our uid>`, created 0700 where we may (our own private probe
    directory, or we are root); refuses one someone else owns."""
    uid = os.geteuid()
    protocol.ensure_base(base)
    base_fd = protocol.open_dir(base)
    try:
        try:
            os.mkdir(str(uid), 0o700, dir_fd=base_fd)
        except FileExistsError:
            pass
        except PermissionError:
            if not os.path.lexists(os.path.join(base, str(uid))):
                raise WaitingForDaemon(f"{base}/{uid} is not there yet: the gpuwatch daemon "
                                       "makes it when this process uses a GPU") from None
        fd = protocol.open_dir(str(uid), dir_fd=base_fd)
    finally:
        os.close(base_fd)
    st = os.fstat(fd)
    if st.st_uid != uid:
        os.close(fd)
        raise PermissionError(f"{base}/{uid} belongs to uid {st.st_uid}, not to us")
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o700)
    return fd


class Agent:
    def __init__(self, config: ProbeConfig | None = None) -> None:
        self.config = config or ProbeConfig()
        self.pid = os.getpid()
        self.uid = os.geteuid()
        self.create_time = _own_create_time()
        self.allowed_uids = {0, self.uid, *self.config.request_uids}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one publish / request at a time (stop vs thread)
        self._dir: str | None = None
        self._dir_fd: int | None = None
        self._reader: AllocatorReader | None = None
        self._history_on = False
        self._oom: oom_recorder.OomRecorder | None = None
        self._oom_tried = False
        self._next_publish = 0.0
        self._next_poll = 0.0
        self.interval = self.config.interval_seconds
        self._warned: set[str] = set()
        self.publishes = 0
        self.requests_handled = 0
        self.last_publish_seconds = 0.0

    # -- life cycle -----------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpuwatch-probe", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0, exiting: bool = False) -> None:
        """End the thread and remove this process's record (and unanswered results).
        exiting: the interpreter is ending (an open OOM record says the process exited)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if self._oom is not None:
            oom_recorder.uninstall(self._oom, exiting)  # its records outlive the process
            self._oom = None
        with self._lock:
            if self._dir_fd is not None:
                protocol.unlink_quietly(self._dir_fd, protocol.stats_name(self.pid))
                with contextlib.suppress(OSError):
                    self._sweep_results(self._dir_fd, every=True)
                self._close_dir()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step(time.monotonic())
            due = min(self._next_publish, self._next_poll) - time.monotonic()
            self._stop.wait(max(due, 0.001))

    def step(self, now: float) -> None:
        """One turn of the loop; never raises."""
        with self._lock:
            if self._stop.is_set():
                return
            if "torch" not in sys.modules:
                # Not a PyTorch program (yet): no directory, no record, nothing to answer.
                self._next_publish = self._next_poll = now + self.config.interval_seconds
                return
            if self._oom is not None:
                self._oom.tick()
            try:
                if now >= self._next_publish:
                    self.publish()
                    self._next_publish = now + self.interval
                if now >= self._next_poll:
                    self._next_poll = now + self.config.request_poll_seconds
                    self.poll_requests()
            except Exception as exc:
                self._warn_once(type(exc).__name__, "gpuwatch probe: %s: %s",
                                type(exc).__name__, exc)
                self._close_dir()  # reopen next time: the directory may have been replaced
                self._next_publish = now + self.interval
                self._next_poll = now + self.config.request_poll_seconds

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    # -- directory --------------------------------------------------------------------
    def own_dir(self) -> tuple[str, int]:
        base = resolve_dir(self.config.dir)
        path = os.path.join(base, str(self.uid))
        if self._dir_fd is not None and self._dir != path:
            # A root daemon created the shared directory since we started: move there.
            protocol.unlink_quietly(self._dir_fd, protocol.stats_name(self.pid))
            self._close_dir()
        if self._dir_fd is None:
            self._dir_fd = open_own_dir(base)
            self._dir = path
        return path, self._dir_fd

    def _close_dir(self) -> None:
        if self._dir_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._dir_fd)
        self._dir_fd = None
        self._dir = None

    # -- publishing -------------------------------------------------------------------
    def torch(self) -> Any | None:
        """The host's torch, once it has initialised CUDA; None before (never imported here)."""
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        try:
            if not torch.cuda.is_initialized():
                return None
        except AttributeError:  # the host is still importing torch
            return None
        return torch

    def collect(self) -> protocol.ProbeRecord:
        record = protocol.ProbeRecord(pid=self.pid, t=time.time(),
                                      create_time=self.create_time,
                                      interval_seconds=self.interval)
        host = sys.modules.get("torch")
        if host is not None and getattr(getattr(host, "version", None), "cuda", "") is None:
            # A CPU build of torch (vLLM's CPU backend, say): there will never be a CUDA
            # allocator here, and waiting for one would look like a broken probe.
            record.status = "no_cuda"
            self._warn_once("no_cuda", "gpuwatch probe: torch %s in pid %d is built without "
                            "CUDA; this process has no GPU memory to report",
                            getattr(host, "__version__", "?"), self.pid)
            return record
        torch = self.torch()
        if torch is None:
            record.status = ("no_torch" if host is None else "cuda_not_initialized")
            return record
        record.torch_version = str(getattr(torch, "__version__", ""))
        if self._reader is None:
            self._reader = AllocatorReader(torch)
        if not self._oom_tried:
            self._oom_tried = True  # once, even if it fails
            self._start_oom(torch)
        if self.config.record_history_max_entries and not self._history_on:
            self._history_on = True  # once, even if it fails
            try:
                actions.enable_history(torch, self.config.record_history_max_entries)
            except Exception as exc:
                self._warn_once("history", "gpuwatch probe: cannot record history: %s", exc)
        try:
            samples = self._reader.read()
        except Exception as exc:
            record.status = f"error: {type(exc).__name__}: {exc}"[:200]
            return record
        for s in samples:
            s["pid"] = self.pid
            s["t"] = record.t
            if self.create_time is not None:
                s["create_time"] = self.create_time
        record.samples = samples  # plain dicts: gpu_uuid travels even where the model lacks it
        return record

    def _start_oom(self, torch: Any) -> None:
        if not self.config.oom_records:
            return
        recorder = oom_recorder.OomRecorder(
            torch, self.config, self.pid, self.create_time,
            open_dir=lambda: open_own_dir(resolve_dir(self.config.dir)),
            on_record=self._publish_soon)
        try:
            why = oom_recorder.install(recorder)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        if why:
            self._warn_once("oom", "gpuwatch probe: no OOM records: %s", why)
            return
        self._oom = recorder

    def _publish_soon(self) -> None:
        # an OOM: the daemon sees num_ooms rise at the next turn of the loop
        self._next_publish = 0.0

    @property
    def oom(self) -> oom_recorder.OomRecorder | None:
        return self._oom

    def publish(self) -> None:
        # CPU time of this thread: what the host can feel (waiting for fsync is not).
        t0 = time.thread_time()
        record = self.collect()
        _path, fd = self.own_dir()
        protocol.write_atomic(fd, protocol.stats_name(self.pid), _encoder.encode(record))
        took = time.thread_time() - t0
        self.last_publish_seconds = took
        self.publishes += 1
        # Stay under the overhead budget: a costly publish stretches the interval.
        self.interval = max(self.config.interval_seconds, took / self.config.max_overhead_ratio)
        if self.publishes % 20 == 0:
            self._sweep_results(fd)

    # -- requests ---------------------------------------------------------------------
    def poll_requests(self) -> None:
        if self._dir_fd is None:
            return
        fd = self._dir_fd
        prefix = f"req-{self.pid}-"
        for name in os.listdir(fd):
            if not name.startswith(prefix):
                continue
            m = protocol.REQUEST_RE.fullmatch(name)
            if m is None or int(m.group(1)) != self.pid:
                continue
            self._handle(fd, name, m.group(2))

    def _handle(self, fd: int, name: str, request_id: str) -> None:
        try:
            data, st = protocol.read_regular(fd, name, protocol.MAX_MESSAGE_BYTES)
        except (OSError, ValueError) as exc:
            self._warn_once(f"req:{type(exc).__name__}", "gpuwatch probe: bad request %s: %s",
                            name, exc)
            protocol.unlink_quietly(fd, name)
            return
        # Taken off first: a request is carried out at most once, even if we crash in it.
        protocol.unlink_quietly(fd, name)
        if st.st_uid not in self.allowed_uids:
            self._warn_once(f"uid:{st.st_uid}", "gpuwatch probe: ignored a request from uid %d",
                            st.st_uid)
            return
        try:
            req = protocol.request_decoder.decode(data)
        except msgspec.DecodeError as exc:
            self._answer(fd, request_id, {"ok": False, "error": f"invalid request: {exc}"})
            return
        if req.id != request_id or req.pid != self.pid:
            self._answer(fd, request_id, {"ok": False, "error": "request names another id"})
            return
        if time.time() - req.t > self.config.request_max_age_seconds:
            return  # the daemon stopped waiting long ago
        self.requests_handled += 1
        self._answer(fd, request_id, self.perform(req))

    def perform(self, req: protocol.Request) -> dict[str, Any]:
        t0 = time.perf_counter()
        torch = self.torch()
        if req.action not in protocol.ACTIONS:
            result: dict[str, Any] = {"ok": False, "error": f"unknown action {req.action!r}"}
        elif torch is None:
            result = {"ok": False, "error": "CUDA is not initialised in this process"}
        else:
            try:
                if self._reader is None:
                    self._reader = AllocatorReader(torch)
                if req.action == "flush":
                    result = actions.flush(self._reader)
                else:
                    assert self._dir is not None and self._dir_fd is not None
                    result = actions.snapshot(torch, req.params or {}, self.pid, req.id,
                                              self._dir, self._dir_fd)
            except Exception as exc:
                result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        result.setdefault("action", req.action)
        result["pid"] = self.pid
        result["took_seconds"] = round(time.perf_counter() - t0, 6)
        if req.action == "flush" and result.get("ok"):
            self._next_publish = 0.0  # show the daemon the new state at once
        return result

    def _answer(self, fd: int, request_id: str, result: dict[str, Any]) -> None:
        protocol.write_atomic(fd, protocol.result_name(self.pid, request_id),
                              _encoder.encode(result))

    def _sweep_results(self, fd: int, every: bool = False) -> None:
        """Remove our answers nobody collected (the daemon timed out or went away)."""
        prefix = f"res-{self.pid}-"
        horizon = time.time() - 2 * self.config.request_max_age_seconds
        for name in os.listdir(fd):
            if name.startswith(prefix):
                with contextlib.suppress(OSError):
                    if every or os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime < horizon:
                        os.unlink(name, dir_fd=fd)
