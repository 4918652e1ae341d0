"""Fast path for the critical slope: the raw samples of the last few tens of seconds.

A leak that fast lifts the minima (and maxima) of every part of a short window above the
previous part's; allocator sawtooth, one or two big allocations, or a ramp at half the pace
topped by one allocation do not. Work per sample is O(1) amortised (monotonic queues of the
window's extremes rule most series out without a pass over the window).
"""

from __future__ import annotations

import math
from collections import deque
from itertools import pairwise


class FastWindow:
    """Raw samples of the last few tens of seconds, for the critical slope.

    The window is cut in parts; a leak that fast lifts both the minimum and the maximum
    of every part above the previous part's. Allocator sawtooth does not (its minima and
    maxima come back each period), nor does one big allocation, nor two (a step lies
    between two parts only), nor a ramp at half the pace topped by one allocation (no one
    step may carry more than half of the rise). Either the minima or the maxima climbing
    part by part is enough, so that a sawtooth drop inside the window does not hide a
    leak, but the minima must rise over the window at half the pace at least.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, float]] = deque()
        # The window's extremes, kept as it slides (monotonic queues): most series cannot
        # rise at the critical pace at all, and are ruled out without a pass over the window.
        self._lows: deque[tuple[float, float]] = deque()
        self._highs: deque[tuple[float, float]] = deque()

    def add(self, t: float, v: float) -> None:
        # written out by hand: this runs for every process on every tick
        w, s, lows, highs = self.window_s, self.samples, self._lows, self._highs
        s.append((t, v))
        while t - s[0][0] > w:
            s.popleft()
        while lows and v <= lows[-1][1]:
            lows.pop()
        lows.append((t, v))
        while t - lows[0][0] > w:
            lows.popleft()
        while highs and v >= highs[-1][1]:
            highs.pop()
        highs.append((t, v))
        while t - highs[0][0] > w:
            highs.popleft()

    def _could_reach(self, threshold: float, rise_s: float) -> bool:
        """Whether any envelope can rise by threshold over rise_s: no part's extreme is
        above the window's highest or below its lowest sample."""
        return self._highs[0][1] - self._lows[0][1] >= threshold * rise_s

    def _envelopes(self, parts: int, min_span: float, threshold: float | None = None):
        """(part length, minima, maxima) of the window's parts; None while the window is
        short or a part is empty, or when no envelope can rise at `threshold`."""
        s = self.samples
        if len(s) < 2 * parts:
            return None
        t0, t1 = s[0][0], s[-1][0]
        span = t1 - t0
        if span < min_span * self.window_s:
            return None
        part = span / parts
        if threshold is not None and not self._could_reach(threshold, (parts - 1) * part):
            return None
        lo = [math.inf] * parts
        hi = [-math.inf] * parts
        for t, v in s:
            k = min(parts - 1, int((t - t0) / part))
            lo[k] = min(lo[k], v)
            hi[k] = max(hi[k], v)
        if math.inf in lo:
            return None
        return part, lo, hi

    def slope(self, threshold: float, parts: int = 4, step_ratio: float = 0.5,
              lows_only: bool = False, min_span: float = 0.66,
              max_step_share: float = 0.5) -> float | None:
        """Rise rate of the parts' minima (or maxima) from the first part to the last,
        when it reaches `threshold` and every part rose by step_ratio of that pace."""
        env = self._envelopes(parts, min_span, threshold)
        if env is None:
            return None
        part, lo, hi = env
        step = step_ratio * threshold * part
        span_s = (parts - 1) * part
        best = None
        for m in (lo,) if lows_only else (lo, hi):
            rise = m[-1] - m[0]
            steps = [b - a for a, b in pairwise(m)]
            # no one step carries most of the rise: a ramp at half the pace (sawtooth, or
            # several summed) topped by one allocation is not a leak that fast
            if (rise >= threshold * span_s and min(steps) >= step
                    and max(steps) <= max_step_share * rise):
                best = rise / span_s if best is None else max(best, rise / span_s)
        if best is not None and ((lo[-1] - lo[0]) / span_s < step_ratio * threshold
                                 or sum(b - a >= step for a, b in pairwise(lo)) < 2):
            # only the maxima climb: transients of random size (churn given back to the
            # driver) do that by chance; a leak lifts the minima too, past a sawtooth drop,
            # and in more than one step (one step kept under churn is not that pace)
            return None
        return best

    def estimate(self, parts: int = 4) -> float | None:
        """Rise rate of the lower envelope over the window, whatever it is: what a fast
        leak's exit level is judged on (sawtooth peaks and transients do not lift it)."""
        env = self._envelopes(parts, 0.66)
        if env is None:
            return None
        part, lo, _ = env
        return (lo[-1] - lo[0]) / ((parts - 1) * part)
