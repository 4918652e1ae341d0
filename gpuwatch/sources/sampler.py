"""Owns the GPU backend for the daemon: opens it, retries with backoff while it is
unavailable, runs its calls on threads (never on the event loop): the fast tier on a sampling
thread that keeps the tick's time itself (start_ticks), or an executor thread per call
(sample), the slow tier on an executor thread; and merges the slow tier's latest values into
each fast sample."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from gpuwatch.config import Config
from gpuwatch.exporter.snapshot import SourceStatus
from gpuwatch.model import GpuSample
from gpuwatch.sources.base import BackendUnavailable, GpuBackend

log = logging.getLogger("gpuwatch")
T = TypeVar("T")


def make_backend(cfg: Config) -> GpuBackend:
    if cfg.simulate:
        from gpuwatch.sources.simulate import SimulatedBackend

        return SimulatedBackend(cfg.simulate, seed=cfg.seed,
                                interval=cfg.nvml.fast_interval_seconds,
                                real_pids=cfg.simulate_pids)
    from gpuwatch.sources.nvml import NvmlBackend

    return NvmlBackend(only=cfg.nvml.gpus, xid_events=cfg.nvml.xid_events)


class Job(NamedTuple):
    """What one sampling job did (on its thread), applied by GpuSampler.take on the loop."""

    kind: str  # ok | waiting (backing off) | unavailable | failed
    now: float
    opened: bool = False  # the backend was opened for it
    error: Any = None
    gpus: list[GpuSample] = []
    after: Any = None  # what the follow-up returned or raised
    took: float = 0.0


class GpuSampler:
    def __init__(self, backend: GpuBackend, status: SourceStatus, retry_max: float) -> None:
        self.backend = backend
        self.status = status
        self.retry_max = retry_max
        self._open = False
        self._retry_at = 0.0
        self._backoff = 1.0
        self._slow: dict[str, dict] = {}
        self._fast_pool = concurrent.futures.ThreadPoolExecutor(1, "gpuwatch-nvml")
        self._slow_pool = concurrent.futures.ThreadPoolExecutor(1, "gpuwatch-nvml-slow")
        self._warned = False
        self._hinted = False
        self._ticks: list[Ticks] = []

    async def sample(self, now: float) -> list[GpuSample]:
        return (await self.sample_then(now, None))[0]

    async def sample_then(self, now: float, then: Callable[[list[GpuSample]], T] | None
                          ) -> tuple[list[GpuSample], T | BaseException | None]:
        """The GPUs, and then(gpus) run on the same executor thread right after a sample
        that succeeded (what it raised, returned in its place; None when it did not run):
        one hand-off to a thread per tick instead of two."""
        loop = asyncio.get_running_loop()
        return self.take(await loop.run_in_executor(self._fast_pool, self._job, now, then))

    def _job(self, now: float, then) -> Job:
        """On the sampling thread: open when due, sample, then; what happened, for take()
        to apply on the loop."""
        opened = False
        if not self._open:
            if time.monotonic() < self._retry_at:
                return Job("waiting", now)
            try:
                self.backend.open()
            except BackendUnavailable as exc:
                return Job("unavailable", now, error=str(exc))
            self._open = opened = True
        t0 = time.perf_counter()
        try:
            gpus = self.backend.sample(now)
        except BackendUnavailable as exc:
            self._open = False
            self.backend.close()
            return Job("unavailable", now, opened, error=str(exc))
        except Exception as exc:  # a sample never kills the daemon
            return Job("failed", now, opened, error=exc)
        took = time.perf_counter() - t0  # then's time is not the sample's
        after = None
        if then is not None:
            try:
                after = then(gpus)
            except Exception as exc:
                after = exc
        return Job("ok", now, opened, gpus=gpus, after=after, took=took)

    def take(self, job: Job) -> tuple[list[GpuSample], Any]:
        """On the loop: the status, logs and backoff of what a job did; its GPUs (the slow
        tier's latest values merged in) and what its follow-up returned."""
        if job.opened:
            self._backoff = 1.0
            log.info("%s backend up (driver %s)", self.backend.name,
                     self.backend.driver_version)
        if job.kind == "waiting":
            return [], None
        if job.kind == "unavailable":
            self._unavailable(str(job.error))
            return [], None
        if job.kind == "failed":
            self.status.errors_total += 1
            self.status.reason = f"sample failed: {job.error!r}"
            log.error("GPU sample failed", exc_info=job.error)
            return [], None
        self.status.up = True
        self.status.reason = ""
        self.status.last_success = job.now
        self.status.last_duration_seconds = job.took
        self._warned = False
        for g in job.gpus:
            for k, v in self._slow.get(g.uuid, {}).items():
                setattr(g, k, v)
        return job.gpus, job.after

    def start_ticks(self, loop: asyncio.AbstractEventLoop, interval: Callable[[], float],
                    then: Callable[[float], Callable | None],
                    deliver: Callable[[Job], None]) -> Ticks:
        """Sample on a thread of its own every interval() seconds, each job handed to the
        loop as deliver(job) (call take() on it there, then Ticks.done()). The thread
        keeps the time itself: a tick wakes the loop once, not for a timer and again for the
        executor's answer."""
        ticks = Ticks(self, loop, interval, then, deliver)
        ticks.thread.start()
        self._ticks.append(ticks)
        return ticks

    def _unavailable(self, reason: str) -> None:
        self.status.up = False
        self.status.reason = reason
        self.status.errors_total += 1
        self._retry_at = time.monotonic() + self._backoff
        level = logging.DEBUG if self._warned else logging.WARNING
        # Said once per run: on a machine without a GPU the simulation is what to try.
        hint = "" if self._hinted else (
            "; without a GPU, try `gpuwatch run --simulate mixed` for a simulated host")
        self._hinted = True
        log.log(level, "GPU backend unavailable: %s; serving without GPU data, retrying in "
                "%.0f s%s", reason, self._backoff, hint)
        self._warned = True
        self._backoff = min(self._backoff * 2, self.retry_max)

    async def slow_loop(self, interval: float, status: SourceStatus) -> None:
        loop = asyncio.get_running_loop()
        # the first read as soon as the backend is open: the fields of the slow tier (the
        # power limit, ECC among them) are absent from the samples until it
        delay = 0.0
        while True:
            await asyncio.sleep(delay)
            if not self._open:
                delay = min(interval, 1.0)
                continue
            delay = interval
            t0 = time.perf_counter()
            try:
                self._slow = await loop.run_in_executor(
                    self._slow_pool, self.backend.sample_slow, time.time()
                )
            except Exception as exc:
                status.errors_total += 1
                status.up = False
                status.reason = repr(exc)
                log.warning("slow-tier sample failed: %r", exc)
                continue
            status.up = True
            status.reason = ""
            status.last_success = time.time()
            status.last_duration_seconds = time.perf_counter() - t0

    def close(self) -> None:
        for ticks in self._ticks:
            ticks.stop()
        if self._open:
            self.backend.close()
        self._fast_pool.shutdown(wait=False, cancel_futures=True)
        self._slow_pool.shutdown(wait=False, cancel_futures=True)


class Ticks:
    """The sampling thread of GpuSampler.start_ticks: one sample per interval, the next
    one only once the loop is done with the last (late: skipped, never a burst)."""

    def __init__(self, sampler: GpuSampler, loop: asyncio.AbstractEventLoop,
                 interval: Callable[[], float], then: Callable[[float], Callable | None],
                 deliver: Callable[[Job], None]) -> None:
        self.sampler, self.loop = sampler, loop
        self.interval, self.then, self.deliver = interval, then, deliver
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self.thread = threading.Thread(target=self._run, name="gpuwatch-ticks", daemon=True)

    def done(self) -> None:
        """The loop has finished with the last delivered job."""
        self._done.set()

    def stop(self) -> None:
        self._stopping.set()
        self._done.set()

    def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            delay = next_at - time.monotonic()
            if self._stopping.wait(delay) if delay > 0 else self._stopping.is_set():
                return
            if not self._done.is_set():  # the loop is late with the last: skip, no burst
                self._done.wait()
                next_at = time.monotonic() + self.interval()
                continue
            now = time.time()
            try:
                job = self.sampler._job(now, self.then(now))
            except Exception as exc:  # then() itself: the tick fails, the thread goes on
                job = Job("failed", now, error=exc)
            self._done.clear()
            next_at += self.interval()  # before the hand-off: the loop wakes to a free GIL
            if next_at < time.monotonic():  # fell behind: skip, never burst
                next_at = time.monotonic() + self.interval()
            try:
                self.loop.call_soon_threadsafe(self.deliver, job)
            except RuntimeError:  # the loop is closed: stopping
                return
