"""Push the latest state to an OTLP/HTTP receiver every interval, in its own task.

Never the tick's problem: encoding (and gzip) runs on a thread, sending in this task with a
deadline, and a receiver that is down or slow costs at most `max_queued` encoded requests (the
oldest is dropped beyond) and one log line per interval. Failures the OTLP specification calls
retryable (no answer, 429, 502, 503, 504) are retried, oldest first, after a backoff that
doubles up to `max_backoff_seconds` (a Retry-After within that bound is honoured); any other
answer rejects that request for good, as the specification says.
"""

from __future__ import annotations

import asyncio
import collections
import gzip
import logging
import time
from collections.abc import Callable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.otlp.config import OtlpConfig
from gpuwatch.otlp.encode import Encoder
from gpuwatch.redact import mask_url

log = logging.getLogger("gpuwatch.otlp")

RETRYABLE = frozenset({429, 502, 503, 504})
MAX_RESPONSE = 64 << 10  # a receiver's answer is read this far, no further


class Retry(Exception):
    def __init__(self, reason: str, after: float | None = None) -> None:
        super().__init__(reason)
        self.after = after


class OtlpPusher:
    def __init__(self, cfg: OtlpConfig, snapshot: Callable[[], Snapshot], host: str,
                 node_name: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self._snapshot = snapshot
        self.encoder = Encoder(host, node_name, delta=cfg.temporality == "delta")
        self.queue: collections.deque[bytes] = collections.deque()
        self._clock = clock
        self._logged_at = -1e300
        self._version = -1
        self._failures = 0  # retryable failures in a row
        self._retry_at = -1e300
        self.counters = {"pushed": 0, "failed": 0, "dropped": 0, "rejected": 0, "queued": 0,
                         "rejected_points": 0}

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/x-protobuf", **self.cfg.headers}
        if self.cfg.compression == "gzip":
            h["Content-Encoding"] = "gzip"
        return h

    async def run(self) -> None:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_seconds)
        async with aiohttp.ClientSession(headers=self.headers(), timeout=timeout) as session:
            loop = asyncio.get_running_loop()
            next_at = loop.time()
            while True:
                await self.once(session)
                next_at += self.cfg.interval_seconds
                if next_at < loop.time():  # fell behind (a slow receiver): skip, never burst
                    next_at = loop.time() + self.cfg.interval_seconds
                await asyncio.sleep(next_at - loop.time())

    async def once(self, session) -> None:
        snap = self._snapshot()
        if snap.tick is not None and snap.version != self._version:
            self._version = snap.version
            try:
                body = await asyncio.to_thread(self._body, snap)
            except Exception:
                log.exception("OTLP: encoding failed")
                body = None
            if body:
                if len(self.queue) >= self.cfg.max_queued:
                    self.queue.popleft()
                    self.counters["dropped"] += 1
                self.queue.append(body)
        if self._clock() >= self._retry_at:
            await self._drain(session)
        self.counters["queued"] = len(self.queue)

    def _body(self, snap: Snapshot) -> bytes | None:
        body = self.encoder.encode(snap)
        if body and self.cfg.compression == "gzip":
            body = gzip.compress(body, compresslevel=5)
        return body

    async def _drain(self, session) -> None:
        """Oldest first; a retryable failure ends this round until the backoff has passed."""
        while self.queue:
            try:
                await self._send(session, self.queue[0])
            except Retry as exc:
                self.counters["failed"] += 1
                self._failures += 1
                backoff = min(self.cfg.interval_seconds * 2 ** (self._failures - 1),
                              self.cfg.max_backoff_seconds)
                if exc.after is not None:
                    backoff = min(max(backoff, exc.after), self.cfg.max_backoff_seconds)
                self._retry_at = self._clock() + backoff
                self._tell(f"{exc}; retrying in {backoff:g} s")
                return
            except ValueError as exc:  # the receiver refused this request: not sent again
                self.queue.popleft()
                self.counters["rejected"] += 1
                self._tell(f"{exc}; request dropped")
                continue
            self.queue.popleft()
            self.counters["pushed"] += 1
            self._failures = 0
            self._retry_at = -1e300

    async def _send(self, session, body: bytes) -> None:
        try:
            # no redirects: the headers (credentials) go to the configured endpoint only
            async with session.post(self.cfg.endpoint, data=body,
                                    allow_redirects=False) as resp:
                answer = await resp.content.read(MAX_RESPONSE)
                status, retry_after = resp.status, resp.headers.get("Retry-After", "")
        except Exception as exc:  # down, slow, reset
            raise Retry(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) \
                from None
        if status // 100 == 2:
            self._partial(answer)
            return
        text = " ".join(answer[:300].decode("utf-8", "replace").split())
        reason = f"HTTP {status}" + (f": {text}" if text else "")
        if status in RETRYABLE:
            after = float(retry_after) if retry_after.isdigit() else None
            raise Retry(reason, after)
        raise ValueError(reason)

    def _partial(self, answer: bytes) -> None:
        """A 2xx may still say that some points were rejected (OTLP's partial success)."""
        if not answer:
            return
        try:
            partial = ExportMetricsServiceResponse.FromString(answer).partial_success
        except Exception:  # not protobuf (a proxy's text): nothing to learn from it
            return
        if partial.rejected_data_points:
            self.counters["rejected_points"] += partial.rejected_data_points
            self._tell(f"the receiver rejected {partial.rejected_data_points} points: "
                       f"{' '.join(partial.error_message[:300].split())}")

    def _tell(self, reason: str) -> None:
        now = self._clock()
        if now - self._logged_at >= self.cfg.interval_seconds:
            self._logged_at = now
            log.warning("OTLP push to %s failed (%d queued, %d dropped so far): %s",
                        self._where(), len(self.queue), self.counters["dropped"], reason)

    def _where(self) -> str:
        return mask_url(self.cfg.endpoint)
