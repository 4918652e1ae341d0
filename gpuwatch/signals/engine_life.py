"""An engine's life as its counters tell it: restarts as published, and endpoints whose
counters cannot be trusted.

An engine without process_start_time_seconds (llama.cpp, Triton, NIM) restarts when its
counters go back. Two processes behind one such URL (a load balancer, a port shared by
replicas) make them go back at almost every scrape: counted as restarts, each would add the
other replica's totals as an offset, and rates, ratios and restart counts would be invented
(246.9 preemptions/s where there are none). More than one such reset within a window marks
the endpoint ambiguous until a whole window passes without one: its counters are not read
and nothing is derived from them; its gauges are still the last answer's.
"""

from __future__ import annotations

from collections import deque


class EngineLife:
    def __init__(self, window_seconds: float) -> None:
        self.window = window_seconds
        self.resets: deque[float] = deque()  # times of resets with no start time to explain
        self.ambiguous_until: float | None = None
        self.published = 0  # restarts as exported: never decreases

    def observe(self, t: float, blind_reset: bool) -> tuple[bool, int]:
        """One scrape: (whether the endpoint is ambiguous now, the correction to the restarts
        detected: the resets of an ambiguous window are not restarts)."""
        was = self.ambiguous_until is not None and t < self.ambiguous_until
        if blind_reset:
            self.resets.append(t)
        while self.resets and self.resets[0] <= t - self.window:
            self.resets.popleft()
        correction = 0
        if blind_reset and (was or len(self.resets) >= 2):
            # not restarts: this one, and (as it turns ambiguous) those counted before it
            correction = -1 if was else -len(self.resets)
            self.ambiguous_until = t + self.window
        elif not was:
            self.ambiguous_until = None
        return self.ambiguous_until is not None, correction

    def publish(self, detected: int) -> int:
        """The restart counter to export: never decreases, so a restart counted before the
        second reset showed an ambiguous endpoint stays counted (at most one too many), as
        does a process counted as a restart before it turned out to be a replica."""
        self.published = max(self.published, detected)
        return self.published

    def why(self) -> str:
        return (f"counters went backwards {len(self.resets)} times within {self.window:g}s and "
                "no process_start_time_seconds tells processes apart: several processes answer "
                "at this URL, or it restarts in a loop; its counters are not read")
