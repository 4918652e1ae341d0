"""Owns the GPU backend for the daemon: opens it, retries with backoff while it is
unavailable, runs its calls on executor threads (never on the event loop), and merges the
slow tier's latest values into each fast sample."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import TypeVar

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

    async def sample(self, now: float) -> list[GpuSample]:
        return (await self.sample_then(now, None))[0]

    async def sample_then(self, now: float, then: Callable[[list[GpuSample]], T] | None
                          ) -> tuple[list[GpuSample], T | BaseException | None]:
        """The GPUs, and then(gpus) run on the same executor thread right after a sample
        that succeeded (what it raised, returned in its place; None when it did not run):
        one hand-off to a thread per tick instead of two."""
        loop = asyncio.get_running_loop()
        if not self._open:
            if time.monotonic() < self._retry_at:
                return [], None
            try:
                await loop.run_in_executor(self._fast_pool, self.backend.open)
            except BackendUnavailable as exc:
                self._unavailable(str(exc))
                return [], None
            self._open = True
            self._backoff = 1.0
            log.info("%s backend up (driver %s)", self.backend.name,
                     self.backend.driver_version)
        try:
            gpus, after, took = await loop.run_in_executor(self._fast_pool, self._sample, now,
                                                           then)
        except BackendUnavailable as exc:
            self._open = False
            await loop.run_in_executor(self._fast_pool, self.backend.close)
            self._unavailable(str(exc))
            return [], None
        except Exception as exc:  # a sample never kills the daemon
            self.status.errors_total += 1
            self.status.reason = f"sample failed: {exc!r}"
            log.exception("GPU sample failed")
            return [], None
        self.status.up = True
        self.status.reason = ""
        self.status.last_success = now
        self.status.last_duration_seconds = took
        self._warned = False
        for g in gpus:
            for k, v in self._slow.get(g.uuid, {}).items():
                setattr(g, k, v)
        return gpus, after

    def _sample(self, now: float, then):
        """On the executor thread; then's time is not the sample's."""
        t0 = time.perf_counter()
        gpus = self.backend.sample(now)
        took = time.perf_counter() - t0
        after = None
        if then is not None:
            try:
                after = then(gpus)
            except Exception as exc:
                after = exc
        return gpus, after, took

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
        while True:
            await asyncio.sleep(interval)
            if not self._open:
                continue
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
        if self._open:
            self.backend.close()
        self._fast_pool.shutdown(wait=False, cancel_futures=True)
        self._slow_pool.shutdown(wait=False, cancel_futures=True)
