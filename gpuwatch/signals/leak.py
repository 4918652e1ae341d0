"""Leak detection for one memory series (a process's memory, or a GPU's).

What counts is the memory a process *keeps*, not its peaks (DESIGN.md §3):

1. **Life cycle** (spec §3). A series starts in `loading`; once growth pauses it is in
   `warmup`; once its retained memory stops rising (or the process is old enough) it is
   `steady`. The trend is judged on steady memory only. A fall below half the steady
   floor is a reload and starts the cycle again; a new pid or a restart (new create time)
   starts a new series. Phase changes reset the baselines, not the verdict.
2. **Retained memory**: the minimum over a floor window (5 min), one point per bucket
   (1 min). Allocator sawtooth and bursts that come back down within the window never reach
   it; a leak raises it.
3. **Trend**: the Theil-Sen slope (median of pairwise slopes) of the retained memory over a
   trend window (24 min). It fires a warning only when the retained memory also rose in
   both halves of the window, the second half by at least 0.4 of the first (warm-up that
   levels off, a lone step, or a transient that outlasts the floor window do not), and
   only after that has held for a few minutes (a transient lifts the floor briefly).
4. **Fast path** for the critical slope (50 MiB/s): the raw samples of the last 40 s cut in
   quarters, whose minima (or maxima) must each climb.
5. **Before steady**, growth whose minima climb at the critical slope through every part of
   a full 50 s window, once the first load has paused, and that would spend the budget
   within the early horizon, is critical: a leak keeps going, loading stops.

Thresholds are reached within a tolerance (10 %: a robust slope of a leak at exactly the
table's 12 MiB/min scatters around it). Each level has an exit level and a minimum hold: a
warning falls back once the retained-memory trend has stayed below half its slope for
10 min, a critical once the raw lower envelope of the last 40 s has stayed below half its
slope for 5 min. Time to OOM escalates a warning to critical (memory.py).

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
    """Theil-Sen slope of the rolling floor (second smallest sample over the floor window),
    one point per bucket. O(floor_n) per closed bucket."""

    def __init__(self, bucket_s: float, floor_s: float, window_s: float) -> None:
        self.bucket_s = bucket_s
        self.floor_n = max(1, round(floor_s / bucket_s))
        self.points: deque[tuple[float, float]] = deque(
            maxlen=max(3, round(window_s / bucket_s) + 1)
        )
        self._k: int | None = None
        self._kmin = (math.inf, math.inf)  # the bucket's two smallest samples
        self._mins: deque[tuple[int, tuple[float, float]]] = deque()  # by bucket
        self.slope: float | None = None
        self.span = 0.0  # seconds between the first and last point

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
            a, b = self._kmin
            self._kmin = (v, a) if v < a else (a, min(b, v))
            return False
        self._close()
        self._k, self._kmin = k, (v, math.inf)
        return True

    def _close(self) -> None:
        k, m = self._k, self._kmin
        assert k is not None
        mins = self._mins
        mins.append((k, m))
        while mins[0][0] <= k - self.floor_n:
            mins.popleft()
        # The floor is the second smallest sample of the window: one sample caught low (a
        # driver hiccup, a read mid-free) would otherwise hold it down for a whole window,
        # while a real trough (sawtooth, churn given back) recurs or lasts a few samples.
        lows = sorted(x for _, pair in mins for x in pair)
        floor = lows[1] if math.isfinite(lows[1]) else lows[0]
        pts = self.points
        pts.append(((k + 1) * self.bucket_s, floor))
        self.span = pts[-1][0] - pts[0][0]
        if len(self.points) >= 3:
            self.slope = theil_sen(self.points)


def _mid3(pts, i: int) -> tuple[float, float]:
    """Point i with the median value of points i-1..i+1."""
    return pts[i][0], sorted((pts[i - 1][1], pts[i][1], pts[i + 1][1]))[1]


class FastWindow:
    """Raw samples of the last few tens of seconds, for the critical slope.

    The window is cut in parts; a leak that fast lifts both the minimum and the maximum
    of every part above the previous part's. Allocator sawtooth does not (its minima and
    maxima come back each period), nor does one big allocation, nor two (a step lies
    between two parts only). Either the minima or the maxima climbing part by part is
    enough, so that a sawtooth drop inside the window does not hide a leak, but the minima
    must rise over the window at half the pace at least.
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
              lows_only: bool = False, min_span: float = 0.66) -> float | None:
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
            rate = (m[-1] - m[0]) / span_s
            if rate >= threshold and all(b - a >= step for a, b in pairwise(m)):
                best = rate if best is None else max(best, rate)
        if best is not None and (lo[-1] - lo[0]) / span_s < step_ratio * threshold:
            # only the maxima climb: transients of random size (churn given back to the
            # driver) do that by chance; a leak lifts the minima too, past a sawtooth drop
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
    """Life cycle, retained-memory trend and leak verdict (0 none, 1 warning, 2 critical).

    `rate` is the estimate published for the series: the judged slope while one is
    judged (the raw lower envelope's climb during a critical episode), else the retained
    memory's recent trend, else 0 (never absent once fed).
    `value`/`threshold` are what the current level was judged on: the rate and the entry
    level it reached.
    """

    def __init__(self, params: LeakParams, t_start: float) -> None:
        self.p = params
        c = params.cfg
        self.life = Lifecycle(c.lifecycle, c.floor_window_seconds, t_start)
        self.early = FastWindow(c.early_window_seconds)
        self._low = RollingMin(c.early_pause_seconds / 2)
        self._low_ref: float | None = None
        self._low_first: float | None = None
        self._low_t = t_start
        self._paused = False  # the lower envelope paused once: loading is over
        # the lower envelope (minimum over half a critical window) over the critical hold
        self._env = RollingMin(c.critical_window_seconds / 2)
        self._env_hist: deque[tuple[float, float]] = deque()
        self._fired_at = -math.inf  # the critical entry last held
        self.level = 0
        self.value: float | None = None
        self.threshold: float | None = None
        self.judged_phase = STEADY  # the phase the current level was entered in
        self._below_since: float | None = None  # below the current level's exit since
        self._reset()

    def _reset(self) -> None:
        """Drop the baselines (the phase changed); the verdict and its hysteresis stay, so
        a leak judged in warm-up goes on as one episode once the process is steady."""
        c = self.p.cfg
        self.trend = RetainedTrend(c.bucket_seconds, c.floor_window_seconds,
                                   c.trend_window_seconds)
        self.fast = FastWindow(c.critical_window_seconds)
        self.rate: float | None = None
        self._trend_since: float | None = None  # a sustained trend seen without a break since
        # Theil-Sen slope of the retained memory over the last floor window
        self._recent_slope: float | None = None

    def _end_episode(self) -> None:
        self.level, self.value, self.threshold, self._below_since = 0, None, None, None
        self.judged_phase = STEADY

    def rebase(self) -> None:
        """The series changed meaning (another source): keep the phase, drop baselines."""
        self._reset()

    @property
    def phase(self) -> str:
        return self.life.phase

    def update(self, t: float, v: float, headroom: float | None = None) -> None:
        """Feed one sample; headroom (bytes left in the GPU's budget) lets growth before
        steady be projected to an OOM."""
        if self.life.update(t, v):
            self._reset()
            if self.life.phase == LOADING:  # a reload: the memory was given back
                self._end_episode()
                self.early = FastWindow(self.p.cfg.early_window_seconds)
                self._paused, self._low_ref, self._low_first, self._low_t = (
                    False, None, None, t)
        if self.life.phase != STEADY:  # only growth before steady is judged on it
            self.early.add(t, v)
        p, c = self.p, self.p.cfg
        hist = self._env_hist
        hist.append((t, self._env.add(t, v)))
        while t - hist[0][0] > c.critical_resolve_seconds:
            hist.popleft()
        crit_on = p.critical * (1 - c.tolerance)
        if self.life.phase != STEADY:
            fire = self._early_fire(t, v, crit_on, headroom)
            self.rate = fire if fire is not None else (
                self.early.estimate(c.early_parts) if self.level else 0.0)
            self._judge(t, 2 if fire is not None else 0, fire, crit_on, None)
            return
        if self.trend.add(t, v):  # a bucket closed: the recent trend moved
            self._recent_slope = theil_sen(list(self.trend.points)[-(self.trend.floor_n + 1):])
        self.fast.add(t, v)
        fast = self.fast.slope(crit_on)
        trend = self.trend.slope if self.trend.span >= c.min_trend_seconds else None
        known = [r for r in (fast, trend) if r is not None]
        judged = max(known) if known else None
        level, value, limit = 0, None, None
        if fast is not None:
            level, value, limit = 2, fast, crit_on
        trend_level, trend_limit = self._trend_level(t, trend, crit_on)
        if trend_level > level:
            level, value, limit = trend_level, trend, trend_limit
        self._judge(t, level, value, limit, trend)
        est = self.fast.estimate() if self.level == 2 else None
        if est is not None:  # a fast leak: what the raw lower envelope climbs now
            self.rate = max(est, fast or est)
        elif judged is not None:
            self.rate = judged
        else:  # the retained memory's recent trend (it lags the floor window)
            self.rate = self._recent_slope or 0.0

    def _early_fire(self, t: float, v: float, crit_on: float,
                    headroom: float | None) -> float | None:
        """Growth before steady that a leak makes and loading does not: after the lower
        envelope paused once (loading over), the minima of every part of a full early
        window climb at the critical slope, and that pace spends the headroom within the
        early horizon. Loading that stops inside the window leaves a flat part."""
        c = self.p.cfg
        floor = self._low.add(t, v)
        settle = c.lifecycle.settle_bytes
        if self._low_first is None:
            self._low_first = floor
        if self._low_ref is None or floor > self._low_ref + settle:
            self._low_ref, self._low_t = floor, t
        elif floor < self._low_ref:
            self._low_ref = floor
        # a pause counts once memory has grown (a reload sits flat before it loads again)
        if (t - self._low_t >= c.early_pause_seconds
                and self._low_ref - self._low_first > 4 * settle):
            self._paused = True
        if not self._paused:
            return None
        rate = self.early.slope(crit_on, parts=c.early_parts, lows_only=True, min_span=0.9)
        if rate is None:
            return None
        if headroom is not None and max(headroom, 0.0) / rate > c.early_horizon_seconds:
            return None
        return rate

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

    def _trend_level(self, t: float, trend: float | None,
                     crit_on: float) -> tuple[int, float | None]:
        """Level of a sustained retained-memory trend, once it has held confirm_seconds."""
        p, c = self.p, self.p.cfg
        level, limit = 0, None
        if trend is not None:
            warn_on = p.warning * (1 - c.tolerance)
            if trend >= crit_on and self._sustained(p.critical):
                level, limit = 2, crit_on
            elif trend >= warn_on and self._sustained(p.warning):
                level, limit = 1, warn_on
        if not level:
            self._trend_since = None
            return 0, None
        if self._trend_since is None:
            self._trend_since = t
        if t - self._trend_since < c.confirm_seconds:
            return 0, None
        return level, limit

    def _exit_rate(self, t: float, trend: float | None) -> float:
        """The current rate a firing level is held on. Critical: the average rise of the
        raw lower envelope over the last critical_resolve_seconds.
        Warning: the retained-memory trend, recent or whole window, whichever is higher
        (it lags, so a slow leak is never resolved by one quiet stretch)."""
        if self.level == 2:
            # the lower envelope's average rise over the hold window: a leak that goes on
            # keeps it far above the exit level; sawtooth and churn come back down, so no
            # lucky 40 s of them can hold an episode open
            hist = self._env_hist
            if t - self._fired_at < self.p.cfg.critical_resolve_seconds:
                return math.inf  # the window must lie wholly after the entry last held
            return (hist[-1][1] - hist[0][1]) / max(hist[-1][0] - hist[0][0], 1e-9)
        known = [r for r in (self._recent_slope, trend) if r is not None]
        return max(known) if known else 0.0

    def _judge(self, t: float, fire: int, value: float | None, limit: float | None,
               trend: float | None) -> None:
        """Enter a level at once when it fires; fall back only after the exit rate has
        stayed below resolve_ratio x the level's threshold for the level's hold time. A
        critical episode that ends falls to warning only if a warning fires on its own."""
        p, c = self.p, self.p.cfg
        if fire == 2:
            self._fired_at = t
        if fire > self.level or (fire and fire == self.level):
            if fire > self.level:
                self.level, self.value, self.threshold = fire, value, limit
                self.judged_phase = self.life.phase
            self._below_since = None
            return
        if not self.level:
            return
        slope = p.critical if self.level == 2 else p.warning
        if self._exit_rate(t, trend) >= c.resolve_ratio * slope:
            self._below_since = None
            return
        if self._below_since is None:
            self._below_since = t
        hold = 0.0 if self.level == 2 else c.resolve_seconds  # critical: its exit is a window
        if t - self._below_since >= hold:
            if fire:
                self.level, self.value, self.threshold = fire, value, limit
                self._below_since = None
            else:
                self._end_episode()
