"""Logging for a failure that can repeat on every tick or scrape: its first occurrence with
its traceback, then at most one line per interval saying how many more there were. A host
whose every tick fails logs about 1 KB a minute, not a traceback per tick."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

INTERVAL_SECONDS = 60.0


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, what: str, every: float = INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = logger
        self.what = what
        self.every = every
        self.clock = clock
        self.failures_total = 0
        self.consecutive = 0
        self.last_error = ""
        self._logged_at: float | None = None
        self._unlogged = 0

    def _due(self) -> bool:
        return self._logged_at is None or self.clock() - self._logged_at >= self.every

    def failed(self, exc: BaseException) -> None:
        self.failures_total += 1
        self.consecutive += 1
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        if not self._due():
            self._unlogged += 1
            return
        more = (f" ({self._unlogged} more times since the last report, "
                f"one report per {self.every:.0f} s)") if self._unlogged else ""
        self.log.error("%s failed%s", self.what, more, exc_info=exc)
        self._logged_at, self._unlogged = self.clock(), 0

    def ok(self) -> None:
        if self.consecutive and self._due():
            self.log.info("%s works again after %d failures in a row", self.what,
                          self.consecutive)
            self._logged_at, self._unlogged = self.clock(), 0
        self.consecutive = 0

    def state(self) -> dict:
        return {"failures_total": self.failures_total,
                "consecutive_failures": self.consecutive, "last_error": self.last_error}
