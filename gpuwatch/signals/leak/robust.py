"""Small robust statistics the leak detector is built from."""

from __future__ import annotations

from collections import deque


def median(values):
    """statistics.median, without the decimal, fractions and random modules it imports
    into the daemon. Raises ValueError on no values."""
    data = sorted(values)
    n = len(data)
    if not n:
        raise ValueError("median of no values")
    mid = n // 2
    return data[mid] if n % 2 else (data[mid - 1] + data[mid]) / 2


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


class SlidingMax:
    """Largest value pushed within the last `window` seconds (0 when none)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.q: deque[tuple[float, float]] = deque()

    def push(self, t: float, v: float) -> None:
        q = self.q
        while q and q[-1][1] <= v:
            q.pop()
        q.append((t, v))

    def value(self, t: float) -> float:
        q = self.q
        while q and t - q[0][0] > self.window:
            q.popleft()
        return q[0][1] if q else 0.0
