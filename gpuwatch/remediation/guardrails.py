"""Limits on how often and how much remediation may act: a cooldown per (action, target), a
global rate limit over a sliding window, and a cap on actions running at once.

Dry runs pass through the same limits, so a dry run shows what a real run would do.

An admitted action is pending until it starts (its "started" record is on disk) or is
abandoned; only a start begins its cooldown, so an action refused at the last moment (say,
the audit log could not be written) may run as soon as it can.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable

# Above this many (action, target) keys, those whose cooldown is over are dropped.
MAX_COOLDOWN_KEYS = 4096


class Guardrails:
    def __init__(self, *, cooldown_seconds: float, rate_limit: int, rate_window_seconds: float,
                 max_concurrent: int, clock: Callable[[], float]) -> None:
        self.cooldown_seconds = cooldown_seconds
        self.rate_limit = rate_limit
        self.rate_window_seconds = rate_window_seconds
        self.max_concurrent = max_concurrent
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._pending: set[tuple[str, str]] = set()
        self._admitted: deque[float] = deque()
        self.in_flight = 0

    def check(self, action: str, target: str) -> tuple[str, str] | None:
        """(result, reason) when the action must be skipped now; None when it may run."""
        now = self.clock()
        last = self._last.get((action, target))
        if last is not None and now - last < self.cooldown_seconds:
            return ("skipped_cooldown",
                    f"{action} on {target} ran {now - last:.0f}s ago "
                    f"(cooldown {self.cooldown_seconds:g}s)")
        if self.cooldown_seconds > 0 and (action, target) in self._pending:
            return ("skipped_cooldown", f"{action} on {target} is about to run")
        while self._admitted and now - self._admitted[0] >= self.rate_window_seconds:
            self._admitted.popleft()
        if len(self._admitted) >= self.rate_limit:
            return ("skipped_rate_limit",
                    f"{len(self._admitted)} actions in the last {self.rate_window_seconds:g}s "
                    f"(limit {self.rate_limit})")
        if self.in_flight >= self.max_concurrent:
            return ("skipped_rate_limit",
                    f"{self.in_flight} actions running (max_concurrent {self.max_concurrent})")
        return None

    def admit(self, action: str, target: str) -> float:
        """Reserve a run: counts against the rate limit and max_concurrent at once; the
        cooldown waits for started(). Returns the admission time (for abandon)."""
        now = self.clock()
        self._pending.add((action, target))
        self._admitted.append(now)
        self.in_flight += 1
        return now

    def started(self, action: str, target: str) -> None:
        """The action runs now: its cooldown begins."""
        now = self.clock()
        self._pending.discard((action, target))
        self._last[(action, target)] = now
        self._forget(now)

    def abandon(self, action: str, target: str, admitted_at: float) -> None:
        """The admitted action did not run: no cooldown, its rate-limit slot is given back."""
        self._pending.discard((action, target))
        with contextlib.suppress(ValueError):  # already out of the window
            self._admitted.remove(admitted_at)
        self.finish()

    def finish(self, action: str | None = None, target: str | None = None) -> None:
        if action is not None:
            self._pending.discard((action, target))
        self.in_flight = max(0, self.in_flight - 1)

    def _forget(self, now: float) -> None:
        """Drop cooldown entries that no longer matter, so the map stays small."""
        if len(self._last) > MAX_COOLDOWN_KEYS:
            for key in [k for k, t in self._last.items() if now - t >= self.cooldown_seconds]:
                del self._last[key]
