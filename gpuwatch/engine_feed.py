"""Engine scrapes become ticks of their own as they arrive.

Waiting for the host's next tick delayed each engine scrape by up to a tick and folded the
scrapes of a fast engine into one: what Prometheus saw of an engine changed on the host's
beat (4 s, then 6 s, for an engine scraped every 5 s on 2 s ticks), so rate() over it
zigzagged around the engine's steady rate. Each scrape is analyzed when it lands, in an
engine-only tick (recorded as such, so replay does the same), and is in /metrics from the
next Prometheus scrape on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gpuwatch.model import EngineSample, Tick

MAX_PENDING = 4096  # samples waiting (endpoints x a stalled analysis); the oldest drop first


class EngineFeed:
    def __init__(self, run_tick: Callable[[Tick], Awaitable[None]],
                 clock: Callable[[], float] = time.time) -> None:
        self.run_tick = run_tick
        self.clock = clock
        self._pending: list[EngineSample] = []
        self._ready = asyncio.Event()
        self.dropped = 0

    def put(self, sample: EngineSample) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._pending.pop(0)
            self.dropped += 1
        self._pending.append(sample)
        self._ready.set()

    async def run(self) -> None:
        """Until cancelled: every batch of scrapes that arrived together is one tick."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            batch, self._pending = self._pending, []
            if batch:
                await self.run_tick(Tick(t=round(self.clock(), 3), engines=batch,
                                         engines_only=True))
