"""One memory series' leak judgement: life cycle, retained floor, scales, fast path, verdict."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gpuwatch.signals.config import LeakConfig
from gpuwatch.signals.leak.fast import FastWindow
from gpuwatch.signals.leak.floor import RetainedFloor
from gpuwatch.signals.leak.lifecycle import LOADING, STEADY, Lifecycle
from gpuwatch.signals.leak.robust import RollingMin
from gpuwatch.signals.leak.scales import Evidence, Scales
from gpuwatch.signals.leak.troughs import Troughs
from gpuwatch.signals.leak.verdict import Verdict


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

    @property
    def warn_on(self) -> float:
        return self.warning * (1 - self.cfg.tolerance)

    @property
    def crit_on(self) -> float:
        return self.critical * (1 - self.cfg.tolerance)


# keys of the evidence whose span grows with every block, beside the scales' own (seconds)
_WHOLE, _TROUGHS = math.inf, -1.0


def confirm_time(cfg: LeakConfig, scale: float) -> float:
    """How long a scale's leak shape must hold before it fires."""
    share = cfg.long_confirm_share if scale >= cfg.long_confirm_from_seconds else cfg.confirm_share
    return min(share * scale, cfg.confirm_seconds)


def retained_floor(cfg: LeakConfig, summed: bool = False) -> RetainedFloor:
    # a sum's members ran before it was first seen: what its first windows gave back is all
    # it tells of its return period yet, so those falls count as its noise too
    return RetainedFloor(cfg.block_seconds, cfg.block_seconds, cfg.max_floor_window_seconds,
                         cfg.return_memory_seconds, 2 * max(cfg.scales_seconds),
                         cfg.floor_tolerance_bytes, bound_returns=not summed,
                         cut_start=not summed)


def scales_of(cfg: LeakConfig, floor: RetainedFloor, history: int = 1) -> Scales:
    return Scales(cfg.scales_seconds, floor, parts=cfg.parts, part_share=cfg.part_share,
                  max_part_share=cfg.max_part_share, steady_ratio=cfg.steady_ratio,
                  lookback_s=cfg.lookback_seconds, min_rise=cfg.min_rise_bytes,
                  noise_factor=cfg.noise_factor, long_scale_s=cfg.long_scale_seconds,
                  levelling_ratio=cfg.levelling_ratio,
                  staircase_from_s=cfg.long_confirm_from_seconds, history=history)


class LeakSeries:
    """Life cycle, retained memory over several scales, and the leak verdict.

    `rate` is the estimate published for the series: the judged rate while a leak is
    judged (the raw lower envelope's climb during a critical episode), else the rate of the
    shortest scale whose retained memory rises beyond its noise, else 0 (never absent once
    fed). `rising` says whether it rises beyond its noise at all (a time to OOM is shown
    only then). `value`/`threshold` are what the current level was judged on.
    """

    def __init__(self, params: LeakParams, t_start: float, summed: bool = False) -> None:
        self.p = params
        # a sum of processes without per-process figures: its first load is its members'
        # together, their returns already recurring
        self.summed = summed
        self.verdict = Verdict()
        self.rate: float | None = None
        self.rising = False
        self.evidence: list[Evidence] = []
        self._seen_old: bool | None = None  # first seen already past warm-up
        self._start(t_start)

    def _start(self, t: float) -> None:
        c = self.p.cfg
        self.life = Lifecycle(c.lifecycle, t, critical=self.p.crit_on)
        self.early = FastWindow(c.early_window_seconds)
        self._reset()

    def _reset(self) -> None:
        """New baselines (a reload, or another source); the verdict is the caller's."""
        c = self.p.cfg
        self.floor = retained_floor(c, self.summed)
        # a sum's floor wanders with its members' beat for tens of minutes: a scale judges
        # once it has seen two of its windows (its noise is what the earlier ones gave back)
        self.scales = scales_of(c, self.floor, 2 if self.summed else 1)
        self.troughs = Troughs(self.floor, noise_factor=c.noise_factor,
                               min_rise=c.min_rise_bytes)
        self.fast = FastWindow(c.critical_window_seconds)
        self._env = RollingMin(c.critical_window_seconds / 2)
        self._env_hist: deque[tuple[float, float]] = deque()
        # scale -> (leak-shaped since, whether the last block broke it)
        self._since: dict[float, tuple[float, bool]] = {}
        self._scale_fire: tuple[int, float | None, float | None, float | None] = (
            0, None, None, None)
        self.evidence = []
        self.rising = False

    def rebase(self) -> None:
        """The series changed meaning (another source): keep the phase, drop baselines."""
        self._reset()

    def members_changed(self, t: float, shift: float, appeared: bool) -> None:
        """A sum of processes (the GPU's used memory, without per-process figures) lost or
        gained members: what departed members held (shift, negative) leaves its whole
        history, and a member that came is loading: the sum is loading again. The floor's
        knowledge (return period, noise) and the verdict stay."""
        c = self.p.cfg
        if shift:
            self.floor.shift(shift)
            self._env_hist = deque((tt, v + shift) for tt, v in self._env_hist)
            self._env = RollingMin(c.critical_window_seconds / 2)
            self.fast = FastWindow(c.critical_window_seconds)
            self.early = FastWindow(c.early_window_seconds)
        if appeared:
            self.life = Lifecycle(c.lifecycle, t, joined=self.life.judging(t),
                                  critical=self.p.crit_on)
            self.early = FastWindow(c.early_window_seconds)
            self.floor.member_loading()

    # -- what the analyzer reads ---------------------------------------------------------------

    @property
    def phase(self) -> str:
        return self.life.phase

    @property
    def level(self) -> int:
        return self.verdict.level

    @property
    def value(self) -> float | None:
        return self.verdict.value

    @property
    def threshold(self) -> float | None:
        return self.verdict.threshold

    @property
    def judged_phase(self) -> str:
        return self.verdict.judged_phase

    # -- per sample ----------------------------------------------------------------------------

    def observe(self, t: float, v: float) -> None:
        """Feed a sample to the retained memory only (a tick the fast path skips: every
        sample counts for the floor, where churn given back within seconds is told apart
        from memory kept; the fast windows take one sample per interval)."""
        life = self.life
        if life.reloaded(v):  # the memory was given back: a new cycle, a new episode
            self.verdict.end()
            self._start(t)
            life = self.life
        if self._seen_old is None:  # the series' first sample (a reload is not one)
            self._seen_old = t - life.t_start >= self.p.cfg.lifecycle.warmup_max_seconds
            life.found_loaded = v > self.p.cfg.lifecycle.found_loaded_bytes
        if life.phase != STEADY and t - life.t_start >= self.p.cfg.lifecycle.warmup_max_seconds:
            life.phase = STEADY  # an old process, found already running
        if self.floor.add(t, v):
            self._blocks(self.floor.t_last or t)

    def update(self, t: float, v: float, headroom: float | None = None) -> None:
        """Feed one sample; headroom (bytes left in the GPU's budget) lets fast growth
        in warm-up be projected to an OOM."""
        self.observe(t, v)
        p, c, life = self.p, self.p.cfg, self.life
        life.sample(t, v)
        hist = self._env_hist
        hist.append((t, self._env.add(t, v)))
        while t - hist[0][0] > c.critical_resolve_seconds:
            hist.popleft()
        fast = self._fast(t, v, headroom)
        fire, value, limit, scale = self._scale_fire
        if fast is not None and (fire < 2 or fast >= (value or 0.0)):
            fire, value, limit, scale = 2, fast, p.crit_on, None
        v_ = self.verdict
        exit_rate, exit_level, hold = self._exit(t)
        v_.judge(t, fire, value, limit, life.phase, scale, exit_rate, exit_level, hold)
        self._publish(fast)

    def _fast(self, t: float, v: float, headroom: float | None) -> float | None:
        """The critical path: in steady, the fast window; before, the early rule (once the
        steep part of loading paused, and only growth that would spend the headroom within
        the early horizon); while loading steeply, nothing (a smooth load is as fast)."""
        c, life, crit_on = self.p.cfg, self.life, self.p.crit_on
        if life.phase == STEADY:
            self.fast.add(t, v)
            return self.fast.slope(crit_on)
        self.early.add(t, v)
        if life.t_steep is None:  # its steep part may still be loading
            return None
        # only the minima count, and a young leak under churn climbs in uneven steps
        rate = self.early.slope(crit_on, parts=c.early_parts, lows_only=True, min_span=0.9,
                                max_step_share=1.0)
        if rate is None:
            return None
        if headroom is not None and max(headroom, 0.0) / rate > c.early_horizon_seconds:
            return None
        return rate

    def _blocks(self, t: float) -> None:
        """A block closed: the phase, the scales' evidence, and what it fires."""
        p, c, life = self.p, self.p.cfg, self.life
        life.block(t, self.floor)
        if life.t_loaded is not None:
            self.floor.set_origin(life.t_loaded)
        loading = life.phase == LOADING
        since = (None if life.t_paused is None
                 else max(0, round((t - life.t_paused) / c.block_seconds)))
        # a series first seen already running is watched for a longest floor window before
        # it is judged on its trend: its return period is not known before
        min_history = self.floor.max_blocks if self._seen_old else 0
        # a sum whose member joined: no window reaches back over that member's load
        self.evidence = ev = self.scales.update(p.warn_on, since, judge=not loading,
                                                min_history=min_history,
                                                within=since if life.joined else None)
        whole = None
        # growth that never paused: judged as a whole, once it may be no load; and a sum's
        # since its member's load, as long as it would have been taken for loading (its
        # floor lags a young leak by its window: the scales' parts cannot show it yet)
        # (not a sum's own first load: its members' loads and warm-ups together, where a
        # leak is no more told from them than in one process, and told later)
        if (loading and (life.joined or not self.summed)) or (
                life.joined and t - life.t_start < c.lifecycle.warmup_max_seconds):
            whole = self.scales.loading(p.warn_on, c.loading_min_rise_bytes,
                                        c.loading_min_scale_seconds, c.loading_part_ratio,
                                        c.loading_steady_ratio,
                                        round((t - life.t_start) / c.block_seconds),
                                        breakout=self.summed)
            if whole is not None:
                ev = [*ev, whole]
        judging = life.judging(t)
        # under a sawtooth, the troughs rising period after period (troughs.py); only
        # where growth is judged, from the end of the load (not while it is unknown), and
        # not before a series first seen running has shown its return period
        trough = self.troughs.update(p.warn_on, self.floor.origin)
        if trough is not None and judging and (not loading or self.floor.origin is not None) \
                and len(self.floor) > min_history:
            ev = [*ev, trough]
        self.rising = any(e.rising for e in ev)
        best: Evidence | None = None
        spent = self.verdict.ended_at
        for e in ev:
            # the growth judged as a whole has one key: its span grows with every block
            # (and the troughs: their span too)
            key = _WHOLE if e is whole else _TROUGHS if e is trough else e.scale
            held = self._since.get(key)
            if not (e.shaped and judging and t - e.scale >= spent):
                # one block's break does not restart it (where a leak's steps fall against
                # the parts' bounds comes and goes); two do
                if held is not None and not held[1] and judging:
                    self._since[key] = (held[0], True)
                else:
                    self._since.pop(key, None)
                continue
            since_t = t if held is None else held[0]
            self._since[key] = (since_t, False)
            # growth that never paused holds until it kept loading_confirm_bytes more at
            # its pace (at most confirm_seconds): the first ramp of a sawtooth after a load
            # climbs like a leak until it comes back down, a leak goes on
            keep = max(c.confirm_share * c.loading_min_scale_seconds,
                       min(c.loading_confirm_bytes / max(e.rate, 1.0), c.confirm_seconds))
            confirm = (keep if key == _WHOLE
                       # the troughs: while the newest trough still stands a few blocks on
                       else self.troughs.confirm_s if key == _TROUGHS
                       # a sum's breakout, beyond twice all it gave back: as growth that
                       # never paused, where that is sooner (the floor window its members'
                       # transients set made it late already)
                       else min(keep, confirm_time(c, e.scale)) if self.summed and e.breakout
                       else confirm_time(c, e.scale))
            confirmed = t - since_t >= confirm
            if confirmed and (best is None or e.rate > best.rate):
                best = e
        if best is None:
            self._scale_fire = (0, None, None, None)
        elif best.rate >= p.crit_on:
            self._scale_fire = (2, best.rate, p.crit_on, best.scale)
        else:
            self._scale_fire = (1, best.rate, p.warn_on, best.scale)

    def _exit(self, t: float) -> tuple[float, float, float]:
        """(exit rate, exit level, hold) of the current level."""
        p, c, v = self.p, self.p.cfg, self.verdict
        if v.level == 2:
            hist = self._env_hist
            if t - v.fired_at < c.critical_resolve_seconds:
                rate = math.inf  # the window must lie wholly after the entry last held
            else:
                rate = (hist[-1][1] - hist[0][1]) / max(hist[-1][0] - hist[0][0], 1e-9)
            return rate, c.resolve_ratio * p.critical, 0.0
        f = self.floor
        # plus the floor window: the retained memory moves as troughs leave that window, and
        # under a sawtooth (or transients) that set it long, a leak at the warning slope may
        # not move it for most of a shorter exit window
        window = max(v.scale or 0.0, c.exit_window_seconds) + f.period
        n = min(round(window / c.block_seconds), len(f) - 1)
        if n <= 0:
            return math.inf, 0.0, 0.0
        rate = (f.at(0) - f.at(n)) / (n * c.block_seconds)  # type: ignore[operator]
        return rate, c.resolve_ratio * p.warning, c.resolve_seconds

    def _publish(self, fast: float | None) -> None:
        v = self.verdict
        if v.level == 2:
            est = self.fast.estimate() if self.life.phase == STEADY else None
            if est is not None:
                self.rate = max(est, fast or est)
                return
        if v.level:
            now = next((e.rate for e in self.evidence if e.scale == v.scale), None)
            self.rate = max(now or 0.0, fast or 0.0) or v.value
            return
        self.rate = next((e.rate for e in self.evidence if e.rising), 0.0)
