"""Phase of a memory series, recognised by its shape (spec §3): loading -> warmup -> steady.

- **loading**: from the process's start (or a reload) until the retained memory first
  pauses: it has grown by more than 4 x settle_bytes (or was first seen holding more than
  found_loaded_bytes: loaded before it was seen), then stayed within pause_bytes for
  loading_settle_seconds longer than its floor window (which holds a trough that long).
  Model weights arrive as a few large steps, or a smooth climb, and then stop. Growth
  before that pause is taken for loading until it has gone on for loading_max_seconds;
  after that it is judged on scales of minutes, at a pace that does not slow down (a load
  does not keep one for that long). The floor's window starts once the steep part of
  loading paused (the lower envelope, flat for steep_pause_seconds). The critical path
  waits only for the envelope to climb no faster than steep_pause_share of the critical
  slope for as long: an allocator sawtooth that starts as the load ends is never flat, but
  it is no steep load.
- **warmup**: after the pause. Growth is judged at once on every scale: growth that keeps
  a steady pace after the first pause is a leak, whatever the process's age.
- **steady**: the retained memory has not risen by settle_bytes for warmup_settle_seconds,
  or the process is older than warmup_max_seconds. The phase is reported; only the
  critical fast path differs (signals/leak/fast.py).

A sum of processes (the GPU's used memory without per-process figures) that a member joins
once it is judged loads again, but the load is that member's alone: it is over once its steep
part paused. The sum's floor, its window the others' return period (their sawtooths and
transients, up to 15 min), cannot stay flat for a window while they go on, nor while a leak
does, and the sum would be taken for loading for warmup_max_seconds.

A fall of a sample below reload_drop_ratio of the retained memory after loading (or after
its steep part: a load under a sawtooth may never pause) is a reload (the memory was given
back): the cycle starts again. A new pid or a restart (a new create time) starts a new
series.
"""

from __future__ import annotations

from gpuwatch.signals.config import LifecycleConfig
from gpuwatch.signals.leak.floor import RetainedFloor
from gpuwatch.signals.leak.robust import RollingMin

LOADING, WARMUP, STEADY = "loading", "warmup", "steady"


class Lifecycle:
    def __init__(self, cfg: LifecycleConfig, t_start: float, joined: bool = False,
                 critical: float = 0.0) -> None:
        self.cfg = cfg
        self.t_start = t_start
        self.phase = LOADING
        self.joined = joined  # a member joined a sum already judged: its load, not the sum's
        self.t_paused: float | None = None  # the first pause: loading is over
        # the steep part of loading is over (where the floor's window starts): the lower
        # envelope (minimum over half steep_pause_seconds) paused that long once grown
        self.t_loaded: float | None = None
        self._low = RollingMin(cfg.steep_pause_seconds / 2)
        self._low_first: float | None = None
        self._flat = _Pause(t_start, cfg.settle_bytes)
        # ... as the critical path sees it (a slower climb after it, an allocator
        # sawtooth's first ramp, does not matter at the critical slope): the same envelope
        # climbs no faster than steep_pause_share of it
        self.t_steep: float | None = None
        self._steep = _Pause(t_start, cfg.settle_bytes, cfg.steep_pause_share * critical)
        self.first: float | None = None  # the retained memory first seen
        # first seen already holding what it loaded: a pause needs no growth before it
        self.found_loaded = False
        self.low: float | None = None  # lowest retained memory since (the steep part of) loading
        self._flat_ref: float | None = None
        self._flat_since = t_start
        self._rise_ref: float | None = None
        self._rise_t = t_start

    def reloaded(self, v: float) -> bool:
        """Whether this sample is a reload: far below the retained memory after loading."""
        low = self.low
        return (low is not None and low > 0 and v < self.cfg.reload_drop_ratio * low)

    def sample(self, t: float, v: float) -> None:
        """A sample of the fast path's cadence: whether the steep part of loading is over."""
        if self.t_loaded is not None:  # the strict pause comes last
            return
        low = self._low.add(t, v)
        if self._low_first is None:
            self._low_first = low
        if self.t_steep is None and self._paused(self._steep, t, low):
            self.t_steep = t
        if self._paused(self._flat, t, low):
            self.t_loaded = t
            self.t_steep = self.t_steep or t

    def _paused(self, pause: _Pause, t: float, low: float) -> bool:
        # a pause counts once memory has grown (a reload sits flat before it loads again)
        held = pause.held(t, low)
        return held >= self.cfg.steep_pause_seconds and (
            self.found_loaded or pause.ref - self._low_first > 4 * self.cfg.settle_bytes)

    def block(self, t: float, floor: RetainedFloor) -> bool:
        """Take a closed block of the retained memory; True when the phase changed."""
        cfg, r = self.cfg, floor.at(0)
        if r is None:
            return False
        if self.first is None:
            self.first = r
        before = self.phase
        if self.phase == LOADING and self.joined and self.t_loaded is not None:
            # the member's steep part paused: the others were loaded already
            self.phase, self.t_paused = WARMUP, t
            self._rise_ref, self._rise_t = r, t
        if self.phase == LOADING:
            tol = cfg.pause_bytes
            ref = self._flat_ref
            if ref is None or r > ref + tol or r < ref - tol:
                self._flat_ref, self._flat_since = r, t
            # flat for longer than the floor window: a floor holds a trough that long
            elif (t - self._flat_since >= cfg.loading_settle_seconds + floor.period
                  - floor.block_s and (r - self.first > 4 * cfg.settle_bytes
                                       or self.found_loaded)):
                self.phase, self.t_paused = WARMUP, t
                self.t_loaded = self.t_loaded or t
                self.t_steep = self.t_steep or t
                self._rise_ref, self._rise_t = r, t
        # after loading, or once its steep part paused (a load that never pauses, under a
        # sawtooth, can still be given back and loaded again)
        if self.phase != LOADING or self.t_loaded is not None:
            self.low = r if self.low is None else min(self.low, r)
        if self.phase == WARMUP:
            if self._rise_ref is None or r > self._rise_ref + cfg.settle_bytes:
                self._rise_ref, self._rise_t = r, t
            elif r < self._rise_ref:
                self._rise_ref = r
            if t - self._rise_t >= cfg.warmup_settle_seconds:
                self.phase = STEADY
        if self.phase != STEADY and t - self.t_start >= cfg.warmup_max_seconds:
            self.phase = STEADY  # growth that never paused is still compared with all of it
            self.low = r if self.low is None else min(self.low, r)
        return self.phase != before

    def judging(self, t: float) -> bool:
        """Whether growth is judged now (not while it may still be loading)."""
        return self.phase != LOADING or t - self.t_start >= self.cfg.loading_max_seconds


class _Pause:
    """How long the lower envelope has climbed no more than `settle` bytes, plus `slow`
    bytes a second, above its lowest value since it last climbed beyond that."""

    def __init__(self, t_start: float, settle: float, slow: float = 0.0) -> None:
        self.settle = settle
        self.slow = slow
        self.ref: float | None = None
        self.t = t_start

    def held(self, t: float, low: float) -> float:
        if self.ref is None or low > self.ref + self.settle + self.slow * (t - self.t):
            self.ref, self.t = low, t
        elif low < self.ref:
            self.ref = low
        return t - self.t
