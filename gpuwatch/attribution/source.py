"""The daemon's attribution source: a cache of who runs each GPU process, refreshed on a
slow interval on its own thread, applied to every sample's processes (a dict lookup per
process). It fails soft: whatever part is missing (no kubelet socket, an unreadable /proc)
leaves those labels empty, and its status says why."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time

from gpuwatch.attribution.join import Attribution
from gpuwatch.attribution.resolver import Host, resolve
from gpuwatch.exporter.snapshot import SourceStatus
from gpuwatch.model import GpuSample

log = logging.getLogger("gpuwatch")

Key = tuple[int, float | None]  # (pid, create time): a reused pid is another process


class AttributionSource:
    def __init__(self, host: Host, status: SourceStatus, *, refresh_seconds: float = 60.0,
                 min_refresh_seconds: float = 5.0, slurm_environ: bool = True) -> None:
        self.host = host
        self.status = status
        self.refresh_seconds = refresh_seconds
        self.min_refresh_seconds = min_refresh_seconds
        self.slurm_environ = slurm_environ
        self.cache: dict[Key, Attribution] = {}
        self._last: float | None = None
        self._task: asyncio.Task | None = None
        # GPU uuid -> [(namespace, pod, container)]: who holds a GPU, processes seen or not
        self.gpu_owners: dict[str, list[tuple[str, str, str]]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "gpuwatch-attribution")

    def _due(self, keys: set[Key], now: float) -> bool:
        if self._last is None:
            return True
        since = now - self._last
        return since >= self.refresh_seconds or (
            since >= self.min_refresh_seconds and not keys <= self.cache.keys())

    async def update(self, gpus: list[GpuSample], now: float) -> None:
        """Refresh when due, on the executor (never on the event loop), then label. A refresh
        for processes not seen before is awaited, so their first sample is labelled; a
        periodic one runs in the background, so a slow kubelet never delays a tick."""
        keys = {(p.pid, p.create_time) for g in gpus for p in g.processes}
        if keys and self._task is None and self._due(keys, now):
            self._last = now
            refresh = self._refresh(gpus, keys, now)
            if keys <= self.cache.keys():
                self._task = asyncio.create_task(refresh)
                self._task.add_done_callback(self._refreshed)
            else:
                await refresh
        apply(gpus, self.cache)

    def _refreshed(self, task: asyncio.Task) -> None:
        self._task = None

    async def _refresh(self, gpus: list[GpuSample], keys: set[Key], now: float) -> None:
        pid_gpus: dict[int, set[str]] = {}
        index = {g.uuid: g.index for g in gpus}
        for g in gpus:
            for p in g.processes:
                pid_gpus.setdefault(p.pid, set()).add(g.uuid)
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            res = await loop.run_in_executor(
                self._pool, lambda: resolve(self.host, pid_gpus, gpu_index=index,
                                            slurm_environ=self.slurm_environ))
        except Exception as exc:  # attribution never costs a sample
            self.status.up, self.status.reason = False, f"attribution failed: {exc!r}"
            self.status.errors_total += 1
            log.exception("attribution failed")
            return
        self.cache = {k: res.attributions[k[0]] for k in keys if k[0] in res.attributions}
        self.gpu_owners = res.gpu_owners
        self.status.up = True
        self.status.reason = "; ".join(f"{k}: {v}" for k, v in res.problems.items())
        self.status.last_success = now
        self.status.last_duration_seconds = time.perf_counter() - t0

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


def apply(gpus: list[GpuSample], cache: dict[Key, Attribution]) -> None:
    for g in gpus:
        for p in g.processes:
            att = cache.get((p.pid, p.create_time))
            if att is None:
                continue
            p.namespace, p.pod = att.namespace or "", att.pod or ""
            p.container, p.slurm_job_id = att.container or "", att.slurm_job_id or ""
            p.pod_labels = att.pod_labels or {}
            p.pod_annotations = att.pod_annotations or {}


def make_source(cfg, backend, sources: dict[str, SourceStatus]) -> AttributionSource | None:
    """The daemon's attribution source, or None when it is off. A simulation attributes
    only through its own simulated node: its pids are not this host's."""
    a = cfg.attribution
    if not a.enabled:
        return None
    if cfg.simulate:
        host = getattr(backend, "attribution_host", lambda: None)()
    else:
        from gpuwatch.attribution.resolver import ProcHost

        host = ProcHost.from_config(cfg)
    if host is None:
        return None
    # Up until a pass fails: a host with no GPU process yet has nothing to attribute, which
    # is not a failure (the status page must not raise an alarm over it).
    status = sources.setdefault("attribution", SourceStatus(up=True))
    # The daemon labels from what users cannot forge: a SLURM_JOB_ID a process sets itself
    # is `gpuwatch attribution`'s to show, so the daemon never reads environments.
    return AttributionSource(host, status, refresh_seconds=a.refresh_seconds,
                             min_refresh_seconds=a.min_refresh_seconds, slurm_environ=False)
