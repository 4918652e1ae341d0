"""Leak detection for one memory series (a process's memory, or a GPU's).

What counts is the memory a process *keeps*, not its peaks (DESIGN.md §3):

1. **Life cycle** (spec §3). A series starts in `loading`; once growth pauses it is in
   `warmup`; once its retained memory stops rising (or the process is old enough) it is
   `steady`. Only steady memory is judged. A fall below half the steady floor is a reload
   and starts the cycle again; a new pid or a restart (new create time) starts a new
   series. Every phase change resets the baselines.
2. **Retained memory**: the minimum over a floor window (5 min), one point per bucket
   (1 min). Allocator sawtooth and bursts that come back down within the window never reach
   it; a leak raises it.
3. **Trend**: the Theil-Sen slope (median of pairwise slopes) of the retained memory over a
   trend window (24 min). It fires a warning only when the retained memory also rose in
   both halves of the window, the second half by at least 0.4 of the first (warm-up that
   levels off, a lone step, or a transient that outlasts the floor window do not), and
   only after that has held for a few minutes (a transient lifts the floor briefly).
4. **Fast path** for the critical slope (50 MB/s): the raw samples of the last 40 s cut in
   quarters, whose minima (or maxima) must each climb.

Thresholds are reached within a tolerance (10 %: a robust slope of a leak at exactly the
table's 12 MB/min scatters around it). A leak resolves once its slope has stayed below half
the threshold for 10 min. Time to OOM escalates a warning to critical (memory.py).

Work per sample is O(1) amortised: monotonic deques for the minima, a bounded list of
bucket points (Theil-Sen over 25 points once per bucket), a bounded raw window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from statistics import median

from gpuwatch.signals.config import LeakConfig, LifecycleConfig

LOADING, WARMUP, STEADY = "loading", "warmup", "steady"


def theil_sen(points) -> float | None:
    """Median of the slopes between every pair of (t, v) points with distinct t."""
    pts = list(points)
    slopes = [
        (v2 - v1) / (t2 - t1)
        for i, (t1, v1) in enumerate(pts)
        for (t2, v2) in pts[i + 1:]
        if t2 > t1
    ]
    return median(slopes) if slopes else None


class RollingMin:
    """Minimum of the raw samples of the last `window` seconds (monotonic deque)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.q: deque[tuple[float, float]] = deque()

    def add(self, t: float, v: float) -> float:
        q = self.q
        while q and q[-1][1] >= v:
            q.pop()
        q.append((t, v))
        while t - q[0][0] > self.window:
            q.popleft()
        return q[0][1]


class Lifecycle:
    """Phase of a series: loading -> warmup -> steady (spec §3).

    Loading ends when growth pauses (no new high for loading_settle). Warm-up ends when
    the retained memory (the rolling minimum over the floor window, which allocator
    sawtooth and warm-up peaks do not move) has stopped rising for warmup_settle, and at
    the latest warmup_max after the process started. A fall below reload_drop_ratio of the
    steady floor is a reload: loading again.
    """

    def __init__(self, cfg: LifecycleConfig, floor_window: float, t_start: float) -> None:
        self.cfg = cfg
        self.floor_window = floor_window
        self._restart(t_start, None)

    def _restart(self, t: float, v: float | None) -> None:
        self.t_start = t
        self.phase = LOADING
        self.high = v
        self.t_rise = t
        self.t_warmup = t
        self.rmin = RollingMin(self.floor_window)
        self.floor_ref: float | None = None
        self.t_floor_rise = t
        self.steady_floor: float | None = None

    def update(self, t: float, v: float) -> bool:
        """Feed one sample; True when the phase changed (baselines must reset)."""
        cfg = self.cfg
        before = self.phase
        if self.phase == STEADY:
            floor = self.steady_floor
            if floor is not None and floor > 0 and v < cfg.reload_drop_ratio * floor:
                self._restart(t, v)
                return True
            self.steady_floor = v if floor is None else min(floor, v)
            return False
        if self.high is None or v > self.high + max(cfg.new_high_bytes,
                                                     cfg.new_high_ratio * self.high):
            self.high, self.t_rise = v, t
        elif v > self.high:
            self.high = v  # a small rise moves the high but not the settle clock
        floor = self.rmin.add(t, v)
        if self.phase == LOADING and t - self.t_rise >= cfg.loading_settle_seconds:
            self.phase, self.t_warmup = WARMUP, t
            self.floor_ref, self.t_floor_rise = floor, t
        elif self.phase == WARMUP:
            ref = self.floor_ref
            if ref is None or floor > ref + cfg.settle_bytes:
                self.floor_ref, self.t_floor_rise = floor, t
            elif floor < ref:
                self.floor_ref = floor
            if (t - self.t_floor_rise >= cfg.warmup_settle_seconds
                    and t - self.t_warmup >= self.floor_window):
                self.phase = STEADY
        if t - self.t_start >= cfg.warmup_max_seconds:
            self.phase = STEADY
        if self.phase == STEADY:
            self.steady_floor = v
        return self.phase != before


class RetainedTrend:
    """Theil-Sen slope of the rolling minimum, one point per bucket."""

    def __init__(self, bucket_s: float, floor_s: float, window_s: float) -> None:
        self.bucket_s = bucket_s
        self.floor_n = max(1, round(floor_s / bucket_s))
        self.points: deque[tuple[float, float]] = deque(
            maxlen=max(3, round(window_s / bucket_s) + 1)
        )
        self._k: int | None = None
        self._kmin = math.inf
        self._mins: deque[tuple[int, float]] = deque()  # increasing minima, by bucket
        self.slope: float | None = None

    @property
    def span(self) -> float:
        return self.points[-1][0] - self.points[0][0] if len(self.points) > 1 else 0.0

    def half_rates(self) -> tuple[float, float] | None:
        """Rise rate of the retained memory over each half of the window (each end the
        median of three points). A leak raises both halves alike; warm-up that levels off
        raises the first far more; a step, or a transient that has not come back down,
        only one of them."""
        pts = self.points
        n = len(pts)
        if n < 7:
            return None
        (t0, v0), (tm, vm), (t1, v1) = (_mid3(pts, 1), _mid3(pts, n // 2), _mid3(pts, n - 2))
        return (vm - v0) / (tm - t0), (v1 - vm) / (t1 - tm)

    def add(self, t: float, v: float) -> bool:
        """True when a bucket closed (the slope may have changed)."""
        k = math.floor(t / self.bucket_s)
        if self._k is None or k <= self._k:
            if self._k is None:
                self._k = k
            self._kmin = min(self._kmin, v)
            return False
        self._close()
        self._k, self._kmin = k, v
        return True

    def _close(self) -> None:
        k, m = self._k, self._kmin
        assert k is not None
        mins = self._mins
        while mins and mins[-1][1] >= m:
            mins.pop()
        mins.append((k, m))
        while mins[0][0] <= k - self.floor_n:
            mins.popleft()
        self.points.append(((k + 1) * self.bucket_s, mins[0][1]))
        if len(self.points) >= 3:
            self.slope = theil_sen(self.points)


def _mid3(pts, i: int) -> tuple[float, float]:
    """Point i with the median value of points i-1..i+1."""
    return pts[i][0], sorted((pts[i - 1][1], pts[i][1], pts[i + 1][1]))[1]


class FastWindow:
    """Raw samples of the last few tens of seconds, for the critical slope.

    The window is cut in quarters; a leak that fast lifts both the minimum and the maximum
    of every quarter above the previous quarter's. Allocator sawtooth does not (its minima
    and maxima come back each period), nor does one big allocation, nor two (a step lies
    between two quarters only). Either the minima or the maxima climbing is enough, so that
    a sawtooth drop inside the window does not hide a leak.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, float]] = deque()
        # The window's extremes, kept as it slides (monotonic queues): most series cannot
        # rise at the critical pace at all, and are ruled out without a pass over the window.
        self._lows: deque[tuple[float, float]] = deque()
        self._highs: deque[tuple[float, float]] = deque()

    def add(self, t: float, v: float) -> None:
        s = self.samples
        s.append((t, v))
        while t - s[0][0] > self.window_s:
            s.popleft()
        for q, worse in ((self._lows, v.__le__), (self._highs, v.__ge__)):
            while q and worse(q[-1][1]):
                q.pop()
            q.append((t, v))
            while t - q[0][0] > self.window_s:
                q.popleft()

    def _could_reach(self, threshold: float, rise_s: float) -> bool:
        """Whether any envelope can rise by threshold over rise_s: no part's extreme is
        above the window's highest or below its lowest sample."""
        return self._highs[0][1] - self._lows[0][1] >= threshold * rise_s

    def slope(self, threshold: float, parts: int = 4, step_ratio: float = 0.5) -> float | None:
        """Rise rate of the parts' minima (or maxima) from the first part to the last,
        when it reaches `threshold` and every part rose by step_ratio of that pace."""
        s = self.samples
        if len(s) < 2 * parts:
            return None
        t0, t1 = s[0][0], s[-1][0]
        span = t1 - t0
        if span < 0.66 * self.window_s:
            return None
        part = span / parts
        if not self._could_reach(threshold, (parts - 1) * part):
            return None
        lo = [math.inf] * parts
        hi = [-math.inf] * parts
        for t, v in s:
            k = min(parts - 1, int((t - t0) / part))
            lo[k] = min(lo[k], v)
            hi[k] = max(hi[k], v)
        step = step_ratio * threshold * part
        best = None
        for m in (lo, hi):
            rate = (m[-1] - m[0]) / ((parts - 1) * part)
            if rate >= threshold and all(b - a >= step for a, b in pairwise(m)):
                best = rate if best is None else max(best, rate)
        return best


@dataclass(frozen=True)
class LeakParams:
    """The slopes to judge by (table's, or the config's overrides) and the config."""

    warning: float  # bytes/s
    critical: float
    cfg: LeakConfig

    @classmethod
    def from_config(cls, cfg: LeakConfig, table) -> LeakParams:
        return cls(
            warning=cfg.warning_bytes_per_second or table.leak.warning_bytes_per_second,
            critical=cfg.critical_bytes_per_second or table.leak.critical_bytes_per_second,
            cfg=cfg,
        )


class LeakSeries:
    """Life cycle, retained-memory trend and leak level (0 none, 1 warning, 2 critical)."""

    def __init__(self, params: LeakParams, t_start: float) -> None:
        self.p = params
        self.life = Lifecycle(params.cfg.lifecycle, params.cfg.floor_window_seconds, t_start)
        self._reset()

    def _reset(self) -> None:
        c = self.p.cfg
        self.trend = RetainedTrend(c.bucket_seconds, c.floor_window_seconds,
                                   c.trend_window_seconds)
        self.fast = FastWindow(c.critical_window_seconds)
        self.rate: float | None = None
        self.level = 0
        self._trend_since: float | None = None  # a sustained trend seen without a break since
        self._below_since: float | None = None  # below the resolve level since

    def rebase(self) -> None:
        """The series changed meaning (another source): keep the phase, drop baselines."""
        self._reset()

    @property
    def phase(self) -> str:
        return self.life.phase

    def update(self, t: float, v: float) -> None:
        if self.life.update(t, v):
            self._reset()
        if self.life.phase != STEADY:
            return
        self.trend.add(t, v)
        self.fast.add(t, v)
        p, c = self.p, self.p.cfg
        crit_on = p.critical * (1 - c.tolerance)
        fast = self.fast.slope(crit_on)
        trend = self.trend.slope if self.trend.span >= c.min_trend_seconds else None
        known = [r for r in (fast, trend) if r is not None]
        self.rate = max(known) if known else None
        self._judge(t, fast, trend, crit_on)

    def _sustained(self, threshold: float) -> bool:
        """Both halves of the window rose, and the growth is not levelling off."""
        halves = self.trend.half_rates()
        if halves is None:
            return False
        first, second = halves
        c = self.p.cfg
        return min(first, second) >= c.sustained_ratio * threshold and (
            second >= c.levelling_ratio * first
        )

    def _judge(self, t: float, fast: float | None, trend: float | None,
               crit_on: float) -> None:
        """Fire on the fast path, or on a sustained trend seen for confirm_seconds; fall
        back only after resolve_seconds below the resolve level (the trend has ended)."""
        p, c = self.p, self.p.cfg
        trend_level = 0
        if trend is not None:
            if trend >= crit_on and self._sustained(p.critical):
                trend_level = 2
            elif trend >= p.warning * (1 - c.tolerance) and self._sustained(p.warning):
                trend_level = 1
        if not trend_level:
            self._trend_since = None
        elif self._trend_since is None:
            self._trend_since = t
        if trend_level and t - self._trend_since < c.confirm_seconds:  # type: ignore[operator]
            trend_level = 0
        fire = max(2 if fast is not None and fast >= crit_on else 0, trend_level)
        rate = self.rate if self.rate is not None else 0.0
        hold = 0
        if self.level == 2 and rate >= p.critical * c.resolve_ratio:
            hold = 2
        elif self.level >= 1 and rate >= p.warning * c.resolve_ratio:
            hold = 1
        level = max(fire, hold)
        if level >= self.level:
            self._below_since = None
            self.level = level
            return
        if self._below_since is None:
            self._below_since = t
        if t - self._below_since >= c.resolve_seconds:
            self.level, self._below_since = level, None
