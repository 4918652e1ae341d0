"""Render a Snapshot as Prometheus text, once per state version (a scrape never waits)."""

from __future__ import annotations

import logging

from gpuwatch.exporter import families
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.exporter.text import exposition

log = logging.getLogger(__name__)


class SnapshotCollector:
    """A prometheus_client custom collector over whatever snapshot it is given."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self.modules = families.modules()

    def collect(self):
        snap = self.snapshot
        for module in self.modules:
            try:
                # Materialise first: a family module that raises loses only its own series.
                metrics = list(module.collect(snap))
            except Exception:
                log.exception("metric family %s failed", module.__name__)
                continue
            yield from (m for m in metrics if m.samples)  # no empty HELP/TYPE blocks


class Renderer:
    def __init__(self) -> None:
        self.collector = SnapshotCollector()
        self._cache: tuple[int, bytes] | None = None

    def render(self, snap: Snapshot) -> bytes:
        if self._cache is not None and self._cache[0] == snap.version:
            return self._cache[1]
        self.collector.snapshot = snap
        body = exposition(self.collector.collect())
        self._cache = (snap.version, body)
        return body
