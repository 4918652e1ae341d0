"""Retained memory of one series: what it keeps, not its peaks.

Raw samples are cut in blocks (15 s); a block's value is its second smallest sample (one
sample caught low, a read mid-free, does not move it). The series' first block, cut short by
its start, is not judged, nor is what the points over the first floor window (which the
start cut short) give back the series' noise (`whole`). The retained memory at a block is the
lowest block value over a *floor window* as long as the series' own **return period**: how
long the series takes to come back down to a level it left. A sawtooth of period P comes
back each period, so its floor window is P and the sawtooth never reaches the floor; churn
given back within seconds, or a series that never comes back down (a leak on a flat
floor), needs one block, so the floor follows a leak with no lag.

A return is a block whose value comes back within the series' tolerance (six times the
lower quartile of the gap between a block's two lowest samples, about three times the
floor's own jitter, or of the change between consecutive blocks where that is smaller: a
sawtooth sampled a few times a period puts a ramp's step between a block's two lowest
samples; at least `tol_bytes`; at least half the drop that brought it back: the
troughs of a sawtooth rise as memory grows under it) of an earlier block, with every block in
between above that (the newest such block not above it beyond its jitter: the sawtooth's
last trough, not a level partway up its ramp); the return period is the longest return
seen over the last `memory_seconds`, with a margin of a fifth (returns are measured to the
block and within the tolerance, which cuts a sawtooth's ramp short). A fall to a level
below everything in the longest floor window is memory given back, not a return. When the
floor window changes, the retained series is recomputed from the block values, so a wider
window never shows as a fall, nor a narrower one as a rise.

Work per sample is O(1) amortised: a block's close costs one pass over the floor window
(at most `max_window / block` values) and one over the last 32 block-to-block changes.
"""

from __future__ import annotations

import math
from collections import deque

from gpuwatch.signals.leak.robust import SlidingMax


class BlockPoints:
    """One value per block, newest last: what Scales reads of a series (`points`)."""

    points: deque[float]

    def at(self, blocks_ago: int) -> float | None:
        """The value `blocks_ago` blocks before the last one (None: no data)."""
        pts = self.points
        if blocks_ago < 0 or blocks_ago >= len(pts):
            return None
        return pts[-1 - blocks_ago]

    def __len__(self) -> int:
        return len(self.points)

    def whole(self, k: int) -> bool:
        """Whether block k's point spans all of its window (a sum of points: always)."""
        return True


class RetainedFloor(BlockPoints):
    def __init__(self, block_s: float, min_window_s: float, max_window_s: float,
                 memory_s: float, keep_s: float, tol_bytes: float,
                 bound_returns: bool = True, cut_start: bool = True) -> None:
        self.block_s = block_s
        # whether a point over a window that the series' start cut short is told apart
        self.cut_start = cut_start
        self.min_blocks = max(1, round(min_window_s / block_s))
        self.max_blocks = max(self.min_blocks, round(max_window_s / block_s))
        self.keep = max(3, round(keep_s / block_s) + 1)
        self.tol_min = tol_bytes
        self._k: int | None = None  # the open block
        self._lo = (math.inf, math.inf)  # its two smallest samples
        self._k_first = True  # the open block is the series' first
        # closed blocks' values, oldest first, contiguous up to block k_last
        self.lows: deque[float] = deque(maxlen=self.keep + self.max_blocks)
        self.points: deque[float] = deque(maxlen=self.keep)  # retained memory per block
        self.k_last: int | None = None
        self.k_first: int | None = None  # the series' first judged block
        self.window = self.min_blocks  # floor window, in blocks
        self._stack: deque[tuple[int, float]] = deque()  # suffix minima of block values
        self._returns = SlidingMax(memory_s)
        self._changes: deque[float] = deque(maxlen=32)
        self._steps: deque[float] = deque(maxlen=32)  # |change| between block values
        self.tol = tol_bytes
        # the first block the floor window may reach back to: not into the load (a window
        # longer than the time since the load would show the load leaving it as a rise)
        self.origin: int | None = None
        # no return reaches back before this block: a level left in the load (a process's
        # own, or a member's that joined a sum) is no level the series comes back to
        self.returns_from: int | None = None
        # (not a sum's first load: its members' together, their returns already recurring)
        self.bound_returns = bound_returns

    # -- feeding -----------------------------------------------------------------------------

    def add(self, t: float, v: float) -> bool:
        """Feed one sample; True when a block closed (a new retained point exists)."""
        k = math.floor(t / self.block_s)
        if self._k is None or k <= self._k:  # (the clock went back: into the open block)
            if self._k is None:
                self._k = k
            a, b = self._lo
            self._lo = (v, a) if v < a else (a, min(b, v))
            return False
        if self._k_first:
            # the series' first block, cut short by its start: a few samples, whose second
            # smallest may be a peak (churn caught as the series was first seen), and a high
            # first block would count as the series' noise for as long as its history is kept
            self._k_first = False
            self._k, self._lo = k, (v, math.inf)
            return False
        a, b = self._lo
        value = b if math.isfinite(b) else a
        if math.isfinite(b):
            # the gap between a block's two lowest samples: the jitter of the floor itself;
            # its lower quartile, as churn caught in a block widens some gaps
            self._changes.append(b - a)
            if self.lows:
                self._steps.append(abs(value - self.lows[-1]))
            q = sorted(self._changes)
            jitter = q[len(q) // 4]
            if len(self._steps) >= 8:
                # a sawtooth sampled a few times a period: the two lowest samples of a block
                # are a ramp's step apart, not noise, and blocks that catch its trough agree
                # closer than that
                jitter = min(jitter, sorted(self._steps)[len(self._steps) // 4])
            self.tol = max(self.tol_min, 6.0 * jitter)
        # the open block closes; blocks with no sample after it keep its value
        first = max(self._k, k - (self.keep + self.max_blocks))
        for blk in range(first, k):
            self._close(blk, value, (blk + 1) * self.block_s)
        self._k, self._lo = k, (v, math.inf)
        return True

    def _close(self, k: int, value: float, t_end: float) -> None:
        self._track_return(k, value, t_end)
        self.lows.append(value)
        self.k_last = k
        if self.k_first is None:
            self.k_first = k
        period = self._returns.value(t_end)
        # a margin over the longest return seen: returns are measured to the block and
        # within the tolerance, which cuts a sawtooth's ramp short
        need = round(1.2 * period / self.block_s)
        window = min(self.max_blocks, max(self.min_blocks, need))
        if window != self.window:
            self.window = window
            self._recompute()
        else:
            lows = self.lows
            n = min(window, len(lows))
            if self.origin is not None and k >= self.origin:
                # a block before the origin (the load ended in the block still open) keeps
                # its full window
                n = min(n, k - self.origin + 1)
            self.points.append(min(lows[i] for i in range(len(lows) - n, len(lows))))

    def _track_return(self, k: int, m: float, t_end: float) -> None:
        st, tol = self._stack, self.tol
        if self.lows:
            # a drop comes back to the level it left within half of its own height: the
            # troughs of a sawtooth rise as memory grows under it (warm-up, a slow leak),
            # its period does not change
            tol = max(tol, 0.5 * (self.lows[-1] - m))
        while st and k - st[0][0] > self.max_blocks:
            st.popleft()
        above = False
        while st and st[-1][1] > m + tol:
            st.pop()
            above = True
        if above and st:
            # back within tol of a level left, every block between above it: the newest
            # level not above this one beyond the floor's own jitter (a sawtooth's last
            # trough, not a level partway up its ramp, which a drop's tol also reaches)
            back = next((kk for kk, vv in reversed(st) if vv <= m + self.tol), st[-1][0])
            # a level left before the block a member's load ended in (in a sum) is that
            # load: no level the series comes back to
            if self.returns_from is None or back >= self.returns_from:
                self._returns.push(t_end, (k - back) * self.block_s)
        while st and st[-1][1] >= m:
            st.pop()
        st.append((k, m))

    def _recompute(self) -> None:
        """The retained series under the current floor window, from the block values."""
        lows, n = list(self.lows), self.window
        first = (self.k_last or 0) - len(lows) + 1  # block index of lows[0]
        start = (self.origin - first) if self.origin is not None else 0
        q: deque[int] = deque()  # indices of a sliding minimum
        out = []
        for i, v in enumerate(lows):
            if i == start:
                q.clear()  # the window starts again at the origin
            while q and lows[q[-1]] >= v:
                q.pop()
            q.append(i)
            while q[0] <= i - n:
                q.popleft()
            out.append(lows[q[0]])
        self.points.clear()
        self.points.extend(out[-self.keep:])

    def shift(self, delta: float) -> None:
        """Move the whole history by delta (memory a departed member held is gone from the
        series it was summed into: as if it had never been there)."""
        a, b = self._lo
        self._lo = (a + delta, b + delta)
        for q in (self.lows, self.points):
            q.extend([v + delta for v in (q.popleft() for _ in range(len(q)))])
        self._stack = deque((k, v + delta) for k, v in self._stack)

    def set_origin(self, t: float) -> None:
        """From the block after t on, the floor window does not reach back before it, nor
        does a return: a drop soon after the load (a sawtooth whose first ramp the load's
        end cut short) that comes back to a level of the load's last steps is no period."""
        if self.origin is None:
            self.origin = math.floor(t / self.block_s) + 1
            if self.bound_returns:
                self.returns_from = self.origin - 1

    def member_loading(self) -> None:
        """A member joined the sum and loads: the origin moves to the end of its load, and
        no return reaches back into it (its steps are no level the sum comes back to)."""
        self.origin, self.bound_returns = None, True

    # -- reading -----------------------------------------------------------------------------

    def whole(self, k: int) -> bool:
        """Whether block k's retained point spans a whole floor window (not one that the
        series' start cut short, where a peak the series was first seen at still stands)."""
        if not self.cut_start:
            return True
        return self.k_first is not None and k - self.k_first + 1 >= self.window

    @property
    def period(self) -> float:
        """The floor window in seconds (the series' return period, within bounds)."""
        return self.window * self.block_s

    @property
    def t_last(self) -> float | None:
        """End of the last closed block."""
        return None if self.k_last is None else (self.k_last + 1) * self.block_s
