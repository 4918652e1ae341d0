"""The leak verdict of one series (0 none, 1 warning, 2 critical) and its episode.

A level is entered at once when it fires, and left only after its exit rate has stayed
below resolve_ratio x its slope for its hold: a warning on the retained memory's rise over
its exit window (the scale it fired on, at least 2 min, plus the floor window) for
resolve_seconds; a critical on the raw lower envelope's average rise over the last
critical_resolve_seconds, all of it after the entry last held (no floor lag, and sawtooth
cannot hold it open). A critical
episode that ends falls back to a warning only if a warning fires on its own then. The
severity of one episode only rises until it ends, and an episode spans phase changes. Once
an episode ended, only evidence gathered wholly after its end starts a new one: a window
that still holds the leak that stopped does not fire it again.
"""

from __future__ import annotations

import math

from gpuwatch.signals.leak.lifecycle import STEADY


class Verdict:
    def __init__(self) -> None:
        self.level = 0
        self.value: float | None = None  # the rate the level was judged on
        self.threshold: float | None = None  # the entry level it reached
        self.judged_phase = STEADY  # the phase the level was entered in
        self.scale: float | None = None  # the scale a warning fired on (None: fast path)
        self.started: float | None = None  # when the episode began
        self._below_since: float | None = None
        self.fired_at = -math.inf  # the critical entry last held
        self.ended_at = -math.inf  # when the last episode ended (the evidence before it is spent)

    def end(self, t: float = -math.inf) -> None:
        self.level, self.value, self.threshold, self._below_since = 0, None, None, None
        self.judged_phase, self.scale, self.started = STEADY, None, None
        self.ended_at = t

    def judge(self, t: float, fire: int, value: float | None, limit: float | None,
              phase: str, scale: float | None, exit_rate: float, exit_level: float,
              hold: float) -> None:
        """fire: the level the evidence reaches now (0 none). exit_rate is compared with
        exit_level (resolve_ratio x the current level's slope) for `hold` seconds."""
        if fire == 2:
            self.fired_at = t
        if fire > self.level or (fire and fire == self.level):
            if fire > self.level:
                if self.level == 0:
                    self.started = t
                self.level, self.value, self.threshold = fire, value, limit
                self.judged_phase, self.scale = phase, scale
            self._below_since = None
            return
        if not self.level:
            return
        if exit_rate >= exit_level:
            self._below_since = None
            return
        if self._below_since is None:
            self._below_since = t
        if t - self._below_since >= hold:
            if fire:
                self.level, self.value, self.threshold = fire, value, limit
                self.scale = scale
                self._below_since = None
            else:
                self.end(t)
