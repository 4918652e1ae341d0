"""Scrape inference engines' /metrics: every endpoint on its own interval and session.

Each endpoint runs in its own task with its own aiohttp session, a deadline per scrape
and a cap on the response size, so a slow, huge or broken endpoint delays nobody else.
Every scrape, failed ones included, becomes an EngineSample for the sink: the recording
keeps errors too, so an engine going down replays exactly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from gpuwatch import __version__
from gpuwatch.engines import discovery as disc
from gpuwatch.engines.config import DiscoveryConfig, EngineConfig
from gpuwatch.engines.normalize import compact
from gpuwatch.engines.urls import engines_from_urls, host_port, is_local, same_local_endpoint
from gpuwatch.model import EngineSample
from gpuwatch.redact import strip_userinfo as redact

log = logging.getLogger(__name__)

# Ask for the classic text format; engines that only speak something else still answer
# with text, and any content type is accepted (some send application/octet-stream).
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
CHUNK = 64 * 1024

Sink = Callable[[EngineSample], None]

__all__ = ["EngineSource", "engines_from_flags", "scrape"]


def engines_from_flags(urls, taken=()) -> list[EngineConfig]:
    """EngineConfigs for repeatable `--engine URL` flags (kind auto, named host:port)."""
    return engines_from_urls(urls, taken)


def _headers(cfg: EngineConfig) -> dict[str, str]:
    headers = {"Accept": ACCEPT, "User-Agent": f"gpuwatch/{__version__}"}
    headers.update(cfg.headers)
    if cfg.bearer_token:
        headers["Authorization"] = f"Bearer {cfg.bearer_token}"
    return headers


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ClientConnectorError):
        text = f"connection failed: {exc.os_error or exc}"
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        text = "server closed the connection"
    elif not isinstance(exc, aiohttp.ClientError):
        text = f"{type(exc).__name__}: {text}"
    return text[:300]


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> tuple[bytes | None, str]:
    if resp.content_length is not None and resp.content_length > cap:
        return None, f"response of {resp.content_length} bytes is over the {cap}-byte limit"
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > cap:
            resp.close()  # drop the connection instead of draining the rest
            return None, f"response is over the {cap}-byte limit"
        chunks.append(chunk)
    return b"".join(chunks), ""


async def scrape(
    session: aiohttp.ClientSession, cfg: EngineConfig, pids: list[int] | None = None,
    clock: Callable[[], float] = time.time,
) -> EngineSample:
    """One scrape of one endpoint; never raises (except cancellation)."""
    t = clock()
    t0 = time.perf_counter()
    text: str | None = None
    error: str | None = None
    try:
        async with asyncio.timeout(cfg.timeout_seconds):
            async with session.get(cfg.url) as resp:
                if resp.status != 200:
                    error = f"HTTP {resp.status} {resp.reason or ''}".strip()
                else:
                    body, why = await _read_capped(resp, cfg.max_body_bytes)
                    if body is None:
                        error = why
                    else:
                        text = compact(body.decode("utf-8", errors="replace"), cfg.kind)
    except TimeoutError:
        error = f"no complete response within {cfg.timeout_seconds:g}s"
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        error = _describe(exc)
    return EngineSample(
        name=cfg.name, kind=cfg.kind, url=redact(cfg.url),
        exposition=text if error is None else None, error=error,
        t=round(t, 3), duration_seconds=round(time.perf_counter() - t0, 6),
        pids=list(pids or []),
    )


class EngineSource:
    def __init__(
        self, engines: list[EngineConfig], discovery: DiscoveryConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engines = list(engines)
        self.discovery = discovery
        self.clock = clock
        self.pids: dict[str, list[int]] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._discovered: dict[str, EngineConfig] = {}

    async def run(self, sink: Sink) -> None:
        """Scrape until cancelled."""
        try:
            for cfg in self.engines:
                self._start(cfg, sink)
            # Configured engines on this host are linked to their pids (and so to their
            # GPUs) even without discovery: the memory signals need to know whose pool is whose.
            if self.discovery.enabled or any(is_local(e.url) for e in self.engines):
                await self._discover_forever(sink)
            else:
                await asyncio.Event().wait()
        finally:
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.clear()

    def _start(self, cfg: EngineConfig, sink: Sink) -> None:
        self._tasks[cfg.name] = asyncio.create_task(
            self._endpoint(cfg, sink), name=f"engine:{cfg.name}"
        )

    async def _endpoint(self, cfg: EngineConfig, sink: Sink) -> None:
        loop = asyncio.get_running_loop()
        # One connection at a time per endpoint; no session-wide timeout (scrape() has one).
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(
            headers=_headers(cfg), connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
        ) as session:
            next_at = loop.time()
            was_up: bool | None = None
            while True:
                sample = await scrape(session, cfg, self.pids.get(cfg.name), self.clock)
                up = sample.error is None
                if up != was_up:
                    if up:
                        log.info("engine %s (%s) is up", cfg.name, sample.url)
                    else:
                        log.warning("engine %s (%s): %s", cfg.name, sample.url, sample.error)
                    was_up = up
                try:
                    sink(sample)
                except Exception:
                    log.exception("engine sample sink failed")
                next_at += cfg.interval_seconds
                now = loop.time()
                if next_at < now:  # the scrape overran the interval: start again now
                    next_at = now
                await asyncio.sleep(next_at - now)

    async def _discover_forever(self, sink: Sink) -> None:
        while True:
            try:
                found, ports = await asyncio.to_thread(self._scan)
            except Exception:
                log.exception("engine discovery failed")
            else:
                self.apply_discovery(found, sink, ports)
            await asyncio.sleep(self.discovery.interval_seconds)

    def _scan(self) -> tuple[list[disc.Found], dict[int, int]]:
        return disc.scan(tuple(self.discovery.kinds)), disc.listeners()

    def apply_discovery(
        self, found: list[disc.Found], sink: Sink, ports: dict[int, int] | None = None
    ) -> None:
        """Attach pids to configured engines; start and stop scraping discovered ones.

        A configured engine's pids come from the engine process its URL's port belongs to:
        the process listening on it, else the discovered engine serving that URL.
        """
        d = self.discovery
        pids: dict[str, list[int]] = {}
        wanted: dict[str, EngineConfig] = {}
        taken = {e.name for e in self.engines}
        for e in self.engines:
            if is_local(e.url):
                listener = (ports or {}).get(host_port(e.url)[1])
                if listener is not None:
                    pids[e.name] = disc.family(listener)
        for f in found:
            configured = next((e for e in self.engines if same_local_endpoint(e.url, f.url)), None)
            if configured is not None:
                pids.setdefault(configured.name, f.pids)
                continue
            if not d.enabled:
                continue
            name, n = f.name, 1
            while name in taken:
                n += 1
                name = f"{f.name}-{n}"
            taken.add(name)
            wanted[name] = EngineConfig(
                name=name, url=f.url, kind=f.kind,
                interval_seconds=d.scrape_interval_seconds, timeout_seconds=d.timeout_seconds,
                max_body_bytes=d.max_body_bytes, down_after_failures=d.down_after_failures,
            )
            pids[name] = f.pids
        self.pids = pids
        for name in [n for n in self._discovered if n not in wanted
                     or wanted[n].url != self._discovered[n].url]:
            log.info("engine %s is gone from the process table", name)
            task = self._tasks.pop(name, None)
            if task is not None:
                task.cancel()
            del self._discovered[name]
        for name, cfg in wanted.items():
            if name not in self._discovered:
                log.info("discovered %s engine %s at %s", cfg.kind, name, cfg.url)
                self._discovered[name] = cfg
                self._start(cfg, sink)
