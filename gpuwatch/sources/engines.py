"""Scrape inference engines' /metrics: every endpoint on its own interval and session.

Each endpoint runs in its own task with its own aiohttp session, a deadline per scrape
and a cap on the response size, so a slow, huge or broken endpoint delays nobody else.
Decompressing, decoding and reading the body run on a small thread pool, never on the
event loop, bounded in bytes (max_body_bytes, after decompression) and in series kept
(max_series). A redirect is followed only to the same scheme, host and port, so configured
headers and tokens never reach another host.
Every scrape, failed ones included, becomes an EngineSample for the sink: the recording
keeps errors too, so an engine going down replays exactly. A body gpuwatch does not
understand is not kept: the error says why, with a short excerpt.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from gpuwatch import __version__
from gpuwatch.engines import discovery as disc
from gpuwatch.engines.body import prepare
from gpuwatch.engines.config import DiscoveryConfig, EngineConfig
from gpuwatch.engines.urls import engines_from_urls, host_port, is_local, same_local_endpoint
from gpuwatch.exposition import Reading
from gpuwatch.model import EngineSample
from gpuwatch.redact import strip_userinfo as redact
from gpuwatch.sources import engine_info

if TYPE_CHECKING:
    import aiohttp
    from yarl import URL

log = logging.getLogger(__name__)

# Ask for the classic text format; engines that only speak something else still answer
# with text, and any content type is accepted (some send application/octet-stream).
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
MAX_REDIRECTS = 3
# Bodies are read in worker processes: reading a big exposition is CPU-bound Python that,
# in a thread, would hold the GIL in long stretches and stall the event loop (/metrics).
# A flood of huge scrapes queues there and never starves the loop or the NVML sampling.
READERS = 2
# Readers yield the CPU to the daemon's loop (/metrics, ticks) and to NVML sampling.
READER_NICENESS = 10
_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()

Sink = Callable[[EngineSample], None]

__all__ = ["EngineSource", "engines_from_flags", "scrape"]


def engines_from_flags(urls, taken=()) -> list[EngineConfig]:
    """EngineConfigs for repeatable `--engine URL` flags (kind auto, named host:port)."""
    return engines_from_urls(urls, taken)


def _headers(cfg: EngineConfig) -> dict[str, str]:
    headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip, deflate",
               "User-Agent": f"gpuwatch/{__version__}"}
    headers.update(cfg.headers)
    if cfg.bearer_token:
        headers["Authorization"] = f"Bearer {cfg.bearer_token}"
    return headers


def _describe(exc: BaseException) -> str:
    import aiohttp

    text = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ClientConnectorError):
        text = f"connection failed: {exc.os_error or exc}"
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        text = "server closed the connection"
    elif not isinstance(exc, aiohttp.ClientError):
        text = f"{type(exc).__name__}: {text}"
    return text[:300]


def session_for(cfg: EngineConfig) -> aiohttp.ClientSession:
    """The endpoint's session: its headers, one connection, bodies left compressed (they
    are decompressed with a bound off the loop), no session-wide timeout (scrape() has one).
    aiohttp is imported here, when the first endpoint starts: a host without engines never
    loads its client (megabytes the daemon would carry for nothing)."""
    import aiohttp

    return aiohttp.ClientSession(
        headers=_headers(cfg), connector=aiohttp.TCPConnector(limit=1),
        timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False,
    )


def _start_readers() -> ProcessPoolExecutor:
    """Start the reader processes (blocking: call it off the loop)."""
    global _pool
    with _pool_lock:
        if _pool is not None:
            return _pool
        # spawn: the daemon has threads, and a fork would copy them and their locks
        pool = ProcessPoolExecutor(READERS, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=os.nice, initargs=(READER_NICENESS,))
        # Workers are spawned on demand by submit(): have them all started here, not in
        # the loop's thread at its first scrapes.
        for f in [pool.submit(time.sleep, 0.2) for _ in range(READERS)]:
            f.result()
        _pool = pool
        return pool


async def _readers() -> ProcessPoolExecutor:
    return _pool if _pool is not None else await asyncio.to_thread(_start_readers)


def _reader_died() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
    _pool = None  # the next scrape starts new readers


def origin(url: str | URL) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in."""
    from yarl import URL

    u = URL(str(url))
    return (u.scheme.lower(), (u.host or "").lower(), u.port)


async def _fetch(
    session: aiohttp.ClientSession, cfg: EngineConfig
) -> tuple[bytes | None, str, str]:
    """(body, Content-Encoding, '') or (None, '', why). Redirects only to the same origin."""
    from yarl import URL

    url = URL(cfg.url)
    home = origin(url)
    for _ in range(MAX_REDIRECTS + 1):
        async with session.get(url, allow_redirects=False) as resp:
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.headers.get("Location", "")
                try:
                    target = url.join(URL(location))
                except ValueError:
                    return None, "", f"HTTP {resp.status} with an invalid Location"
                if origin(target) != home:
                    where = f"{target.scheme}://{target.host}:{target.port}"
                    return None, "", (f"redirected to another host ({where[:120]}): not "
                                      "followed, so the configured headers stay with their host")
                url = target
                continue
            if resp.status != 200:
                return None, "", f"HTTP {resp.status} {resp.reason or ''}".strip()
            body, why = await _read_capped(resp, cfg.max_body_bytes)
            if body is None:
                return None, "", why
            encoding = "" if session.auto_decompress else resp.headers.get(
                "Content-Encoding", "")
            return body, encoding, ""
    return None, "", f"more than {MAX_REDIRECTS} redirects"


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> tuple[bytes | None, str]:
    if resp.content_length is not None and resp.content_length > cap:
        return None, f"response of {resp.content_length} bytes is over the {cap}-byte limit"
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():  # what has arrived: fewest loop turns
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
    reading: Reading | None = None
    error: str | None = None
    body: bytes | None = None
    try:
        async with asyncio.timeout(cfg.timeout_seconds):
            body, encoding, error = await _fetch(session, cfg)
    except TimeoutError:
        error = f"no complete response within {cfg.timeout_seconds:g}s"
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        error = _describe(exc)
    # The duration is the engine's answer; reading it (queued behind other endpoints'
    # bodies, maybe) is gpuwatch's own time and never makes an engine late.
    duration = time.perf_counter() - t0
    if body is not None and not error:
        try:
            text, reading, error = await asyncio.get_running_loop().run_in_executor(
                await _readers(), prepare, body, encoding, cfg.kind, cfg.max_body_bytes,
                cfg.max_series, cfg.max_series_groups)
        except BrokenProcessPool:
            _reader_died()
            error = "the process reading engine responses died; it is restarted"
        except Exception as exc:
            error = f"could not read the response: {_describe(exc)}"
        del body
    sample = EngineSample(
        name=cfg.name, kind=cfg.kind, url=redact(cfg.url),
        exposition=text if not error else None, error=error or None,
        t=round(t, 3), duration_seconds=round(duration, 6),
        pids=list(pids or []),
    )
    if reading is not None and not error:
        sample.reading = (reading, "")  # not recorded: replay reads the exposition again
    return sample


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
        self._gone_since: dict[str, float] = {}  # discovered engines whose process left
        self.monotonic = time.monotonic

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
        if "aiohttp" not in sys.modules:  # its first import takes a while: not on the loop
            await asyncio.to_thread(importlib.import_module, "aiohttp")
        async with session_for(cfg) as session:
            next_at = loop.time()
            was_up: bool | None = None
            info: dict[str, str] = {}
            info_at: float | None = None  # loop time of the last info fetch
            while True:
                sample = await scrape(session, cfg, self.pids.get(cfg.name), self.clock)
                up = sample.error is None
                if up and (not was_up or info_at is None
                           or loop.time() - info_at > engine_info.REFRESH_SECONDS):
                    # first seen, back after being down (maybe upgraded), or due
                    info = await self._info(session, cfg, sample)
                    info_at = loop.time()
                sample.info = dict(info)
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

    @staticmethod
    async def _info(session, cfg: EngineConfig, sample: EngineSample) -> dict[str, str]:
        reading = getattr(sample, "reading", None)
        kind = reading[0].kind if reading and reading[0] is not None else cfg.kind
        url = engine_info.url_for(kind, cfg.url, cfg.info_url)
        if url is None:
            return {}
        return await engine_info.fetch(session, url, kind, cfg.timeout_seconds)

    async def _discover_forever(self, sink: Sink) -> None:
        while True:
            try:
                found, ports = await asyncio.to_thread(self._scan)
            except Exception:
                log.exception("engine discovery failed")
            else:
                self.apply_discovery(found, sink, ports)
            await asyncio.sleep(self.discovery.interval_seconds)

    def _stop(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        self._discovered.pop(name, None)
        self._gone_since.pop(name, None)

    def _scan(self) -> tuple[list[disc.Found], dict[int, int]]:
        found = disc.scan(tuple(self.discovery.kinds))
        # The listening sockets only tie configured local engines to their pids, and reading
        # them walks every process's descriptors (tens of ms on a busy host): not otherwise.
        ports = disc.listeners() if any(is_local(e.url) for e in self.engines) else {}
        return found, ports

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
        # names of engines still expected though gone: a new one at another URL gets its own
        taken = {e.name for e in self.engines} | {
            n for n in self._gone_since
            if not any(f.url == self._discovered[n].url for f in found)}
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
                max_body_bytes=d.max_body_bytes, max_series=d.max_series,
                max_series_groups=d.max_series_groups,
                forget_group_after_scrapes=d.forget_group_after_scrapes,
                down_after_failures=d.down_after_failures, info_url=f.info_url,
            )
            pids[name] = f.pids
        self.pids = pids
        now = self.monotonic()
        for name, cfg in list(self._discovered.items()):
            if name in wanted and wanted[name].url == cfg.url:
                if self._gone_since.pop(name, None) is not None:
                    log.info("engine %s is back in the process table", name)
                continue
            if name in wanted:  # another engine took the name: the old one is replaced
                self._stop(name)
                continue
            # Gone from the process table: still scraped (its scrapes fail, it shows down
            # and engine_down fires) for as long as it was expected, then forgotten.
            since = self._gone_since.setdefault(name, now)
            if since == now:
                log.warning("engine %s is gone from the process table; scraped for %gs more",
                            name, d.expect_gone_seconds)
            if now - since >= d.expect_gone_seconds:
                log.info("engine %s is forgotten (gone for %gs)", name, now - since)
                self._stop(name)
        for name, cfg in wanted.items():
            if name not in self._discovered:
                log.info("discovered %s engine %s at %s", cfg.kind, name, cfg.url)
                self._discovered[name] = cfg
                self._start(cfg, sink)
