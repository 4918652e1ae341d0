"""Limits on how often and how much remediation may act: a cooldown per (action, target), a
global rate limit over a sliding window, and a cap on actions running at once.

Dry runs pass through the same limits, so a dry run shows what a real run would do.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class Guardrails:
    def __init__(self, *, cooldown_seconds: float, rate_limit: int, rate_window_seconds: float,
                 max_concurrent: int, clock: Callable[[], float]) -> None:
        self.cooldown_seconds = cooldown_seconds
        self.rate_limit = rate_limit
        self.rate_window_seconds = rate_window_seconds
        self.max_concurrent = max_concurrent
        self.clock = clock
        self._last: dict[tuple[str, str], float] = {}
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

    def admit(self, action: str, target: str) -> None:
        now = self.clock()
        self._last[(action, target)] = now
        self._admitted.append(now)
        self.in_flight += 1
        self._forget(now)

    def finish(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)

    def _forget(self, now: float) -> None:
        """Drop cooldown entries that no longer matter, so the map stays small."""
        if len(self._last) > 4096:
            for key in [k for k, t in self._last.items() if now - t >= self.cooldown_seconds]:
                del self._last[key]
