"""The fast leak window's shortcut (ruling a series out from the window's extremes) never
changes its answer: checked against the full computation on random series."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.signals.leak import FastWindow


def reference(samples, window_s, threshold, parts=4, step_ratio=0.5):
    """The slope over every part's extremes, with no shortcut."""
    s = list(samples)
    if len(s) < 2 * parts:
        return None
    t0, t1 = s[0][0], s[-1][0]
    span = t1 - t0
    if span < 0.66 * window_s:
        return None
    part = span / parts
    lo, hi = [math.inf] * parts, [-math.inf] * parts
    for t, v in s:
        k = min(parts - 1, int((t - t0) / part))
        lo[k], hi[k] = min(lo[k], v), max(hi[k], v)
    best = None
    for m in (lo, hi):
        rate = (m[-1] - m[0]) / ((parts - 1) * part)
        steps = [b - a for a, b in pairwise(m)]
        if (rate >= threshold and min(steps) >= step_ratio * threshold * part
                and max(steps) <= 0.5 * (m[-1] - m[0])):
            best = rate if best is None else max(best, rate)
    step = step_ratio * threshold * part
    if best is not None and ((lo[-1] - lo[0]) / ((parts - 1) * part) < step_ratio * threshold
                             or sum(b - a >= step for a, b in pairwise(lo)) < 2):
        return None  # only the maxima climbed: the minima must rise too, in two steps or more
    return best


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0.2, 3.0), st.floats(-5e7, 2e8)), min_size=1,
                      max_size=120),
       threshold=st.sampled_from([1e6, 3e7, 5e7, 2e8]))
def test_shortcut_gives_the_full_answer(steps, threshold):
    w = FastWindow(30.0)
    t, v = 1000.0, 1e9
    for dt, dv in steps:
        t, v = t + dt, v + dv
        w.add(t, v)
        assert w.slope(threshold) == reference(w.samples, 30.0, threshold)


def test_a_steady_leak_at_the_critical_pace_is_still_seen():
    w = FastWindow(30.0)
    for k in range(40):
        w.add(1000.0 + k, 1e9 + 6e7 * k)
    assert 5.5e7 < w.slope(5e7) < 6.5e7
    assert w.slope(7e7) is None


MIB = 1 << 20


def _parts(lows, highs, part_s=10, base=20 << 30):
    """Samples alternating between each part's low and high, one a second, over what the
    process holds (base)."""
    return [(k * part_s + j, base + (lows[k] if j % 2 == 0 else highs[k]))
            for k in range(len(lows)) for j in range(part_s)]


def test_maxima_climbing_while_the_minima_fall_back_are_no_fast_leak():
    """Transients of growing size climb part by part; the minima rose in two steps, then
    came back down: over the window they rose at a tenth of the pace, which no leak does."""
    thr, part = 50 * MIB, 9.75  # 40 samples a second apart: parts of 9.75 s
    unit = thr * part
    lows = [0.0, 0.6 * unit, 1.2 * unit, 0.3 * unit]
    highs = [2 * unit, 3.1 * unit, 4.2 * unit, 5.3 * unit]
    w = FastWindow(40)
    for t, v in _parts(lows, highs):
        w.add(t, v)
    assert w.slope(thr) is None
    # the same maxima over minima that keep rising: the fast pace (the maxima's)
    lows[-1] = 1.8 * unit
    w = FastWindow(40)
    for t, v in _parts(lows, highs):
        w.add(t, v)
    assert w.slope(thr) == pytest.approx(1.1 * thr, rel=0.01)


def test_the_estimate_is_the_lower_envelopes_pace():
    """What a critical episode's rate and exit are read from: the climb of the lower
    envelope over the window, at its own pace."""
    w = FastWindow(40)
    for t in range(41):
        w.add(float(t), 10 * MIB * t + (300 * MIB if t % 3 == 0 else 0))  # peaks on top
    assert w.estimate() == pytest.approx(10 * MIB, rel=0.02)
