"""Counters that survive engine restarts, sliding windows over them, histogram quantiles.

Pure and deterministic: time is whatever the caller passes in.
"""

from __future__ import annotations

import bisect
import math
from collections import deque


class CounterBank:
    """Engine counters made monotonic across restarts.

    Counters come in groups (one engine core, one Triton model) whose counters reset
    together. When any counter of a group goes down, or the caller says the process
    restarted, the whole group has reset: each counter's last value is kept as an offset,
    so total = offset + current value never decreases. A group that disappears keeps
    contributing its last total.
    """

    def __init__(self) -> None:
        self.last: dict[str, dict[str, float]] = {}
        self.offset: dict[str, dict[str, float]] = {}
        self.resets = 0

    def update(self, groups: dict[str, dict[str, float]], restarted: bool = False) -> bool:
        """Take one scrape's raw values; returns True if any group reset."""
        reset_any = False
        for group, values in groups.items():
            last = self.last.get(group)
            off = self.offset.setdefault(group, {})
            if last is not None and (restarted or any(
                v < last.get(name, 0.0) for name, v in values.items()
            )):
                reset_any = True
                for name, prev in last.items():
                    off[name] = off.get(name, 0.0) + prev
            if last is None:
                self.last[group] = dict(values)
            else:
                last.update(values)
        if reset_any:
            self.resets += 1
        return reset_any

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for group, values in self.last.items():
            off = self.offset.get(group, {})
            for name, v in values.items():
                out[name] = out.get(name, 0.0) + v + off.get(name, 0.0)
        return out


class Window:
    """Snapshots of counter totals over a sliding time window.

    The oldest snapshot kept is the newest one at or before the window's start, so an
    increase over the window spans at least the whole window once enough data exists.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.snaps: deque[tuple[float, dict[str, float]]] = deque()

    def push(self, t: float, totals: dict[str, float]) -> None:
        if self.snaps and t < self.snaps[-1][0]:
            self.snaps.clear()  # the clock went backwards: start over
        self.snaps.append((t, totals))
        start = t - self.seconds
        while len(self.snaps) >= 2 and self.snaps[1][0] <= start:
            self.snaps.popleft()

    def increase(self, name: str) -> tuple[float, float] | None:
        """(increase, seconds covered) of one counter, from its first snapshot in the window."""
        if len(self.snaps) < 2:
            return None
        t1, last = self.snaps[-1]
        if name not in last:
            return None
        for t0, snap in self.snaps:
            if t0 >= t1:
                return None
            if name in snap:
                return max(last[name] - snap[name], 0.0), t1 - t0
        return None

    def base(self, names: list[str]) -> tuple[float, dict[str, float]] | None:
        """The oldest snapshot holding all names (with the newest one), for multi-counter deltas."""
        if len(self.snaps) < 2 or any(n not in self.snaps[-1][1] for n in names):
            return None
        t1 = self.snaps[-1][0]
        for t0, snap in self.snaps:
            if t0 >= t1:
                return None
            if all(n in snap for n in names):
                return t0, snap
        return None

    @property
    def latest(self) -> dict[str, float]:
        return self.snaps[-1][1] if self.snaps else {}


def histogram_quantile(q: float, bounds: tuple[float, ...], counts: list[float]) -> float | None:
    """Quantile q of a cumulative histogram, interpolated as PromQL's histogram_quantile.

    bounds are sorted upper bounds ending in +Inf, counts the cumulative counts. Returns
    None where PromQL returns NaN (no observations, no +Inf bucket, fewer than 2 buckets).
    """
    if math.isnan(q) or len(bounds) < 2 or len(bounds) != len(counts):
        return None
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not math.isinf(bounds[-1]):
        return None
    # Counts can be non-monotonic after a partial reset or float error: force them
    # monotonic as Prometheus does.
    mono: list[float] = []
    top = 0.0
    for c in counts:
        top = max(top, c)
        mono.append(top)
    total = mono[-1]
    if total <= 0:
        return None
    rank = q * total
    b = bisect.bisect_left(mono, rank)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0
    end = bounds[b]
    count = mono[b]
    if b > 0:
        start = bounds[b - 1]
        count -= mono[b - 1]
        rank -= mono[b - 1]
    if count <= 0:
        return end
    return start + (end - start) * (rank / count)
