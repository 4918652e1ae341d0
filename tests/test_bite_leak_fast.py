"""The fast leak window's shortcut (ruling a series out from the window's extremes) never
changes its answer: checked against the full computation on random series."""

from __future__ import annotations

import math
from itertools import pairwise

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
