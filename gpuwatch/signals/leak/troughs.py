"""Trough evidence: a leak under an allocator sawtooth, read from the sawtooth's troughs.

A sawtooth of period P comes back down once per period; what the series keeps is its
troughs. The scales judge the retained memory in parts at least one floor window (about
1.2 P) long, so under a sawtooth they need four or five periods. Where the floor window is
several blocks (the series has a return period), the block values' troughs are kept, one
per period: a block that ends a fall (below the block before it beyond the floor's
tolerance: the sawtooth's drop, however fast memory grows under its ramp) and is no
higher than any block within half a period after it (the newest one is known a block
after it, and stands while nothing lower follows; the evidence fires once it stood two
blocks more). A leak shows as troughs that rise at a steady pace:

- the last `least` or more troughs (two rises or more), a period apart (within a block or
  an eighth: one sawtooth's troughs; a sum of several comes down as their beat has it),
  each rose beyond the trough jitter: the floor's tolerance, and noise_factor x the largest
  fall between consecutive troughs in the history kept (what the troughs give back);
- every rise carries a share of the mean (no lone step: the largest at most `max_share`
  of the total, the smallest at least `min_share` of the mean), and the newest keeps the
  pace (at least `keep_pace` of the mean of the others): a ratchet whose steps grow rarer
  has rises that shrink, to nothing between its steps;
- the troughs rose by min_rise at least, at the warning slope or more, on average, and at
  `keep_pace` of the pace of the growth before them at least (since the end of loading,
  a period of it at least): a warm-up that levels off was faster before.

That is evidence after two or three periods. A floor window of one block (no sawtooth, no
return) keeps no troughs: the scales follow such a series with no lag.
Work per block is O(floor window) (one trough test), O(troughs kept) for their falls.
"""

from __future__ import annotations

from collections import deque
from itertools import pairwise

from gpuwatch.signals.leak.floor import RetainedFloor
from gpuwatch.signals.leak.scales import Evidence


class Troughs:
    def __init__(self, floor: RetainedFloor, *, noise_factor: float, min_rise: float,
                 least: int = 3, most: int = 6, max_share: float = 2 / 3,
                 min_share: float = 0.5, keep_pace: float = 0.7) -> None:
        self.floor = floor
        self.noise_factor = noise_factor
        self.min_rise = min_rise
        self.least = least
        self.most = most
        self.max_share = max_share
        self.min_share = min_share
        self.keep_pace = keep_pace
        self.ks: deque[int] = deque()  # confirmed troughs' block indices, oldest first
        self._window = 0
        # how long the evidence must hold before it fires: the newest trough, known a block
        # after it, stands two blocks more (a drop in two stages, a transient's end that a
        # lower block follows, does not)
        self.confirm_s = 2 * floor.block_s

    def _value(self, k: int) -> float | None:
        f = self.floor
        i = len(f.lows) - 1 - ((f.k_last or 0) - k)
        return f.lows[i] if 0 <= i < len(f.lows) else None

    def _is_trough(self, i: int, h: int, end: int) -> bool:
        """Whether lows[i] ends a fall (below the block before it by more than the floor's
        tolerance: a sawtooth's drop) and is no higher than any block up to h after it
        (before end)."""
        lows = self.floor.lows
        v = lows[i]
        return (i >= 1 and lows[i - 1] - v > self.floor.tol
                and all(lows[j] >= v for j in range(i + 1, min(end, i + h + 1))))

    def _half(self) -> int:
        # half a period: the floor window is the return period with a margin of a fifth
        return max(1, round(self.floor.window / 2.4))

    def _rebuild(self) -> None:
        """The return period changed: the troughs again, from the block values kept."""
        f, h = self.floor, self._half()
        lows, first = f.lows, (f.k_last or 0) - len(f.lows) + 1
        self.ks = deque()
        for i in range(1, len(lows) - h):
            if self._is_trough(i, h, len(lows)) and (not self.ks
                                                     or first + i - self.ks[-1] > h):
                self.ks.append(first + i)

    def update(self, warn_on: float, origin: int | None = None) -> Evidence | None:
        """Evidence from the troughs at the block just closed (None: none, or no leak
        shape). origin: the first block that may hold a trough (after loading)."""
        f = self.floor
        if f.window <= 1 or f.k_last is None:
            self.ks.clear()
            self._window = f.window
            return None
        h, lows, k_last = self._half(), f.lows, f.k_last
        if f.window != self._window:
            self._window = f.window
            self._rebuild()
        else:
            i = len(lows) - 1 - h  # the block whose half period after it just completed
            if self._is_trough(i, h, len(lows)) and (not self.ks
                                                     or k_last - h - self.ks[-1] > h):
                self.ks.append(k_last - h)
        while self.ks and self._value(self.ks[0]) is None:
            self.ks.popleft()
        ks = [k for k in self.ks if origin is None or k >= origin]
        # the newest trough, not yet half a period old: the lowest of the blocks since,
        # once a block followed it
        if len(lows) > h + 1:
            i = min(range(len(lows) - 1 - h + 1, len(lows) - 1), key=lows.__getitem__,
                    default=None)
            if i is not None and self._is_trough(i, h, len(lows)):
                k = k_last - (len(lows) - 1 - i)
                if (origin is None or k >= origin) and (not ks or k - ks[-1] > h):
                    ks.append(k)
        if len(ks) < self.least:
            return None
        vals = [self._value(k) for k in ks]
        # what the troughs give back: their largest fall in the history kept (the load's
        # too: the troughs before it are none of the leak's)
        kept = [self._value(k) for k in self.ks if k < ks[-1]] + [vals[-1]]
        noise = max((max(0.0, a - b) for a, b in pairwise(kept)), default=0.0)  # type: ignore[operator]
        jitter = max(f.tol, self.noise_factor * noise)
        b = f.block_s
        for m in range(self.least, min(self.most, len(ks)) + 1):
            tail = vals[-m:]
            rises = [y - x for x, y in pairwise(tail)]  # type: ignore[operator]
            if min(rises) <= jitter:
                return None  # a rise within the jitter: a longer tail holds it too
            gaps = [y - x for x, y in pairwise(ks[-m:])]
            if max(gaps) - min(gaps) > max(1, min(gaps) // 8):
                return None  # not one sawtooth's period (a sum's troughs come as they beat)
            total = tail[-1] - tail[0]  # type: ignore[operator]
            span = (ks[-1] - ks[-m]) * b
            if (max(rises) > self.max_share * total
                    or min(rises) < self.min_share * total / len(rises)
                    or rises[-1] < self.keep_pace * (total - rises[-1]) / (len(rises) - 1)
                    or total < self.min_rise or total < warn_on * span):
                continue
            # at the pace of the growth before it since loading (a warm-up that levels off
            # was faster before), a period of it at least (right after the load, nothing
            # tells a leak from a warm-up yet)
            ref = origin if origin is not None and self._value(origin) is not None else ks[0]
            if ks[-m] - ref < 2 * h or total / span < self.keep_pace * (
                    tail[0] - self._value(ref)) / ((ks[-m] - ref) * b):  # type: ignore[operator]
                continue
            scale = (k_last - ks[-m] + 1) * b
            return Evidence(scale, total / span, total, noise, True, True)
        return None
