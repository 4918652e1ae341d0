"""Render a Snapshot as Prometheus text, once per state version, ahead of the scrape.

Rendering a large host (8 GPUs x 64 processes) costs a few ms, more than the rest of a tick.
Rendering every tick would spend that on states nobody reads when Prometheus scrapes every
15 s and the daemon ticks every second; rendering only when asked would put it on the scrape.
So the renderer learns the scrape period and renders on the tick just before the next scrape
is due: a scrape finds its bytes ready (at most a tick and a half old), and the daemon renders
once per scrape. Until two scrapes have told the period, the scrapes render their own bytes
(rendering every tick meanwhile would cost a scrape period's worth of renders). Bytes
rendered ahead are never served over a newer engine scrape: the engine's series change once
per engine scrape and show from the next Prometheus scrape on.
"""

from __future__ import annotations

import collections
import logging
import time

from gpuwatch.exporter import families
from gpuwatch.exporter.fold import Folder
from gpuwatch.exporter.metric import GaugeMetricFamily
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.exporter.text import exposition
from gpuwatch.ratelog import RateLimitedLog
from gpuwatch.signals.leak.robust import median

log = logging.getLogger(__name__)


class SnapshotCollector:
    """A prometheus_client custom collector over whatever snapshot it is given."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self.modules = families.modules()
        self.folder = Folder()
        self.errors = {m.__name__: RateLimitedLog(log, f"metric family {m.__name__}")
                       for m in self.modules}

    def collect(self):
        snap = self.snapshot
        count = 0
        for module in self.modules:
            try:
                # Materialise first: a family module that raises loses only its own series.
                metrics = list(self.folder.fold(snap, module.collect(snap)))
            except Exception as exc:
                self.errors[module.__name__].failed(exc)
                continue
            for m in metrics:
                if m.samples:  # no empty HELP/TYPE blocks
                    count += len(m.samples)
                    yield m
        folded = Folder.folded_metric(snap)
        if folded is not None:
            count += len(folded.samples)
            yield folded
        yield GaugeMetricFamily("gpuwatch_exposition_series",
                                "Series in this exposition, this one included (the series "
                                "budget per host).", value=count + 1)


# Scrapes remembered to estimate the period; a scraper silent for this many periods (and at
# least IDLE_SECONDS) is gone, and rendering waits for the next scrape.
SCRAPES_KEPT = 8
IDLE_PERIODS = 4
IDLE_SECONDS = 120.0


# Bytes rendered ahead for a scrape are served up to this many ticks old: the tick that
# rendered them may be followed by another one just before the scrape comes.
AHEAD_MAX_AGE_TICKS = 1.5


class Renderer:
    def __init__(self, clock=time.monotonic) -> None:
        self.collector = SnapshotCollector()
        # version, bytes, rendered at, engine version
        self._cache: tuple[int, bytes, float, int] | None = None
        self._clock = clock
        self._scrapes: collections.deque[float] = collections.deque(maxlen=SCRAPES_KEPT)
        self._tick = 0.0
        self._ahead = False  # the cache was rendered ahead for the coming scrape
        self.renders = 0
        self.renders_on_scrape = 0  # scrapes that found no ready bytes

    def serve(self, snap: Snapshot) -> bytes:
        """A scrape: the bytes of this state, or of the state a tick rendered ahead for
        this scrape if no more than AHEAD_MAX_AGE_TICKS old (rendered now only if neither)."""
        now = self._clock()
        self._scrapes.append(now)
        cache, ahead = self._cache, self._ahead
        self._ahead = False
        if cache is not None and cache[0] != snap.version and ahead and (
                now - cache[2] <= AHEAD_MAX_AGE_TICKS * self._tick) and (
                cache[3] == snap.engine_version):  # an engine scrape since: render it
            return cache[1]
        if cache is None or cache[0] != snap.version:
            self.renders_on_scrape += 1
        return self.render(snap)

    def render_ahead(self, snap: Snapshot) -> None:
        """A tick renders for the scrape it expects (see due)."""
        self.render(snap)
        self._ahead = len(self._scrapes) >= 2

    def due(self, tick_interval: float) -> bool:
        """Whether a tick should render its new state now: a scrape is expected within
        about one tick, and no tick rendered for it yet. Before the period is known, none
        does: the scrape renders."""
        self._tick = tick_interval
        if len(self._scrapes) < 2 or self._ahead:
            return False
        gaps = [b - a for a, b in zip(self._scrapes, list(self._scrapes)[1:], strict=False)]
        period = median(gaps)
        since = self._clock() - self._scrapes[-1]
        if since > max(IDLE_PERIODS * period, IDLE_SECONDS):
            return False
        return since >= period - 1.25 * tick_interval

    def render(self, snap: Snapshot) -> bytes:
        if self._cache is not None and self._cache[0] == snap.version:
            return self._cache[1]
        self.collector.snapshot = snap
        body = exposition(self.collector.collect())
        self._cache = (snap.version, body, self._clock(), snap.engine_version)
        self.renders += 1
        return body
