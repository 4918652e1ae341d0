"""The renderer renders ahead of the expected scrape, about once per scrape."""

from __future__ import annotations

import pytest

from gpuwatch.exporter.render import IDLE_SECONDS, Renderer
from gpuwatch.exporter.snapshot import Snapshot


def drive(scrape_every: float, seconds: float, tick: float = 1.0, phase: float = 0.37,
          stop_scraping_at: float | None = None):
    """Ticks every `tick` s publish a new state; a scraper reads every `scrape_every` s."""
    now = [0.0]
    r = Renderer(clock=lambda: now[0])
    events = [(k * tick, "tick") for k in range(int(seconds / tick))]
    events += [(phase + k * scrape_every, "scrape") for k in range(int(seconds / scrape_every))
               if stop_scraping_at is None or phase + k * scrape_every < stop_scraping_at]
    version = 0
    scrapes = 0
    for t, what in sorted(events):
        now[0] = t
        if what == "tick":
            version += 1
            if r.due(tick):
                r.render_ahead(Snapshot(version=version))
        else:
            scrapes += 1
            assert r.serve(Snapshot(version=version))
            # what was served is the latest state or the one a tick before it
            assert r._cache[0] >= version - 1
    return r, scrapes


@pytest.mark.parametrize("every", [15.0, 30.0, 5.5])
def test_renders_about_once_per_scrape_and_scrapes_find_bytes_ready(every):
    r, scrapes = drive(every, 600)
    # The tick before each scrape; no tick renders before the period is known.
    assert r.renders <= scrapes + 1
    # Only the first two scrapes (before the period is known) render on the scrape path.
    assert r.renders_on_scrape <= 2


def test_fast_scrapes_render_every_tick():
    r, _ = drive(1.0, 120)
    assert r.renders >= 115 and r.renders_on_scrape <= 2


def test_no_scraper_no_rendering():
    r, _ = drive(15.0, 600, stop_scraping_at=0)
    assert r.renders == 0


def test_a_scraper_that_went_away_stops_the_rendering():
    r, _ = drive(15.0, 300 + 2 * IDLE_SECONDS, stop_scraping_at=300)
    longer, _ = drive(15.0, 300 + 5 * IDLE_SECONDS, stop_scraping_at=300)
    busy, _ = drive(15.0, 300)
    # Overdue scrapes keep the ticks rendering for a while, then it stops for good.
    assert longer.renders == r.renders <= busy.renders + IDLE_SECONDS + 3


@pytest.mark.parametrize("phase", [0.05, 0.37, 0.8, 0.99])
def test_whatever_the_phase_one_render_per_scrape_and_none_on_the_scrape(phase):
    r, scrapes = drive(15.0, 900, phase=phase)
    assert r.renders <= scrapes + 1 and r.renders_on_scrape <= 2


def test_a_late_scrape_gets_a_fresh_render_not_old_bytes():
    now = [0.0]
    r = Renderer(clock=lambda: now[0])
    for t in (0.0, 15.0):
        now[0] = t
        r.serve(Snapshot(version=1))
    now[0] = 29.0
    assert r.due(1.0)
    r.render_ahead(Snapshot(version=2))
    now[0] = 40.0  # the scraper was 10 s late: the bytes from 29 s are too old
    r.serve(Snapshot(version=3))
    assert r._cache[0] == 3 and r.renders_on_scrape == 2
