"""Trends of the retained memory over several time scales at once (1, 2, 5, 10, 24 min).

At each block's close every scale S looks at the retained memory over its last S, cut in
`parts` parts. It shows **leak-shaped growth** when the retained memory

- rose by at least `min_rise_bytes`, and by more than `noise_factor` times the series'
  own noise at that scale (the most the retained memory fell over any window of S in the
  history kept: what the series gives back; not from a point whose floor window the series'
  start cut short, where a peak it was first seen at stands) — it is *rising* — and by more than the
  warning slope over S;
- rose through all of its window: every part (at least as long as the floor window, so
  two to `parts` of them; thirds too, where the steps of a leak kept in steps come a third
  of the scale apart) rose by at least `part_share` of an even share, and no one part
  carries more than `max_part_share` of the rise (of four parts; more of fewer): a lone
  step, or two transients one after the other, do not. On the scales confirmed over half
  their length, a window that rose in a regular staircase (steps alike in size, evenly
  spaced, none missing at its ends) is cut in parts no shorter than the gap between its
  steps: a leak kept every 2 min is judged on the 5-min scale by its halves, each holding
  a step, not on quarters that one of them always misses;
- does not level off: its second half rose at least `levelling_ratio` of its first;
- keeps its pace: the window rose at least `steady_ratio` of the pace of what came before
  it (over half the scale, or `lookback_seconds` when longer, not back beyond the end of
  loading): warm-up that levels off, a ratchet whose steps grow ever rarer, do not.

A fast leak is then found on the short scales within a minute or two, a slow one on the
long scales in tens of minutes, by the same tests. `rising` (the first test alone) is what
a time to OOM is shown on: memory that rises beyond its noise.
Work per block is O(scales x parts).
"""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from dataclasses import dataclass
from itertools import pairwise

from gpuwatch.signals.leak.floor import RetainedFloor
from gpuwatch.signals.leak.robust import theil_sen


@dataclass(frozen=True)
class Evidence:
    scale: float  # seconds
    rate: float  # bytes/s: the rise over the scale
    rise: float
    noise: float
    rising: bool  # beyond its noise and the minimum rise
    shaped: bool  # ... and by the warning slope, shaped like a leak (through its window,
    # keeping its pace)
    breakout: bool = False  # judged on the block values, beyond all the series gave back


class Scales:
    def __init__(self, scales_s, floor: RetainedFloor, *, parts: int, part_share: float,
                 max_part_share: float, steady_ratio: float, lookback_s: float,
                 min_rise: float, noise_factor: float, long_scale_s: float = 1200.0,
                 levelling_ratio: float = 0.4, staircase_from_s: float = 150.0,
                 history: int = 1) -> None:
        self.floor = floor
        # a scale judges once the series holds this many of its windows
        self.history = history
        b = floor.block_s
        self.scales = [float(s) for s in scales_s]
        self.blocks = [max(parts, round(s / b)) for s in self.scales]
        self.parts = parts
        # the long scales are judged on halves (a stepwise leak keeps a step every few
        # minutes: each half rises, not each quarter)
        self.scale_parts = [2 if s >= long_scale_s else parts for s in self.scales]
        self.part_share = part_share
        self.max_part_share = max_part_share
        self.steady_ratio = steady_ratio
        self.levelling_ratio = levelling_ratio
        self.staircase_from = staircase_from_s
        self.lookback = max(1, round(lookback_s / b))
        self.min_rise = min_rise
        self.noise_factor = noise_factor
        # the largest fall of the retained memory over each scale, over the history kept
        self._falls: list[deque[tuple[int, float]]] = [deque() for _ in self.scales]
        self._window = floor.window
        # the most the block values ever gave back within a floor window (what a breakout
        # must rise beyond): the sawtooth's drop, a transient's end
        self.give_back = 0.0
        self._highs: deque[tuple[int, float]] = deque()  # sliding max of block values
        self._gb: deque[tuple[int, float]] = deque()  # sliding max of the drawdowns

    def _fall(self, i: int, k: int, fall: float) -> None:
        q = self._falls[i]
        while q and q[-1][1] <= fall:
            q.pop()
        q.append((k, fall))
        while q and k - q[0][0] >= self.floor.keep:
            q.popleft()

    def _rebuild_falls(self) -> None:
        """The floor window changed and the retained series with it: its falls too."""
        f = self.floor
        k_last = f.k_last or 0
        pts = list(f.points)
        for i, n in enumerate(self.blocks):
            self._falls[i].clear()
            for j in range(n, len(pts)):
                if f.whole(k_last - (len(pts) - 1 - (j - n))):
                    self._fall(i, k_last - (len(pts) - 1 - j), max(0.0, pts[j - n] - pts[j]))
        self._highs.clear()
        self._gb.clear()
        lows = list(f.lows)
        for j, v in enumerate(lows[-f.keep:]):
            self._drawdown(k_last - (min(len(lows), f.keep) - 1 - j), v)

    def _drawdown(self, k: int, v: float) -> None:
        h, gb, n = self._highs, self._gb, self.floor.window
        while h and h[-1][1] <= v:
            h.pop()
        h.append((k, v))
        while k - h[0][0] >= n:
            h.popleft()
        dd = h[0][1] - v
        while gb and gb[-1][1] <= dd:
            gb.pop()
        gb.append((k, dd))
        while k - gb[0][0] >= self.floor.keep:
            gb.popleft()
        self.give_back = gb[0][1]

    def noise(self, i: int) -> float:
        q = self._falls[i]
        return q[0][1] if q else 0.0

    def update(self, warn_on: float, since_block: int | None = None, judge: bool = True,
               min_history: int = 0, within: int | None = None) -> list[Evidence]:
        """Evidence per scale at the block just closed. since_block: how many blocks back the
        growth judged may be compared with (the end of loading; None: all of it); judge:
        False measures only (rising, rates) and judges no shape; min_history: blocks a scale
        must have seen beyond its own window before it judges (a series first seen already
        running has a return period yet unknown); within: the longest window judged, in
        blocks (a sum whose member joined: a window that reaches back over the join holds
        its load)."""
        f = self.floor
        if f.window != self._window:
            self._window = f.window
            self._rebuild_falls()
        out: list[Evidence] = []
        now = f.at(0)
        if now is None:
            return out
        k_last = f.k_last or 0
        self._drawdown(k_last, f.lows[-1])
        for i, (scale, n) in enumerate(zip(self.scales, self.blocks, strict=True)):
            then = f.at(n)
            if then is None:
                continue
            if f.whole(k_last - n):
                self._fall(i, k_last, max(0.0, then - now))
            rise = now - then
            noise = self.noise(i)
            rising = rise >= max(self.min_rise, self.noise_factor * noise)
            judged = (judge and len(f) > max(n * self.history, min_history)
                      and (within is None or n <= within))
            k = self.scale_parts[i]
            shaped = (judged and rising and rise >= warn_on * scale
                      and self._shaped(n, k, rise, since_block))
            brk = None
            if judged and not shaped and f.window > 1:
                # a floor window of several blocks lags: growth far beyond anything the
                # series ever gave back is judged on the block values themselves
                brk = self._breakout(n, k, scale, warn_on)
                if brk is not None:
                    rise, shaped, rising = brk, True, True
            out.append(Evidence(scale, rise / scale, rise, noise, rising, shaped,
                                brk is not None))
        return out

    def loading(self, warn_on: float, min_rise: float, min_span_s: float, part_ratio: float,
                steady_ratio: float, reach: int | None = None,
                breakout: bool = True) -> Evidence | None:
        """Growth that has not paused since the series started, judged as a whole from the
        end of its load (its few large steps, or its steep climb, or a short pause after
        them; a leak from the first second has none): it is leak-shaped when it rose by
        min_rise and the warning slope, beyond its noise, through all of its quarters (the
        slowest at least part_ratio of the fastest), its second half at steady_ratio of its
        first's pace at least (robust slopes): a warm-up that levels off, however slowly, is
        slower in its second half. Growth that sped up (its second half faster than its
        first: a leak that started after the load) is judged again on its second half, down
        to min_span_s; growth that slowed down never is. reach: blocks since the series'
        cycle started (None: all of its history). breakout: whether growth the floor window
        lags may be judged on the block values (a sum's; a process's own window is its own
        sawtooth's, and its block values ride that sawtooth's first ramps)."""
        f = self.floor
        b = f.block_s
        reach = len(f) - 1 if reach is None else min(reach, len(f) - 1)
        min_n = max(2 * self.parts, math.ceil(min_span_s / b))
        n = self._load_end(f.at, reach)
        # (a floor of one block pauses as the life cycle sees it: that ends loading)
        pause = self._since_pause(reach) if f.window > 1 else None
        if (pause is not None and pause >= min_n and f.at(0) - f.at(pause)  # type: ignore[operator]
                > self.noise_factor * self.give_back):
            # a pause too short to end loading (a sawtooth's first trough holds the floor
            # flat for less than its window) still ends the load's steps: growth after it
            # beyond what the series gives back (no sawtooth's first ramp) is not the load
            n = min(n, pause)
        ev = None
        m = n
        while m * b >= min_span_s and m >= 2 * self.parts:
            e, sped_up = self._whole(m, warn_on, min_rise, part_ratio, steady_ratio)
            ev = e if ev is None or e.shaped else ev
            if e.shaped or not sped_up:
                break
            m //= 2
        if breakout and (ev is None or not ev.shaped) and n // f.window < self.parts:
            # a floor window longer than a quarter of it lags the whole of it (a sum of
            # processes whose sawtooths and transients set a long return period, kept while
            # a member loads): growth far beyond anything the series gave back is judged on
            # the block values, from the end of the load they show, its slowest part at
            # part_ratio of its fastest (a load's few steps are not)
            lows = f.lows

            def low_at(j: int) -> float | None:
                return lows[-1 - j] if 0 <= j < len(lows) else None

            nb = self._load_end(low_at, min(reach, len(lows) - 1))
            if nb * b >= min_span_s and nb >= 2 * self.parts:
                scale = nb * b
                brk = self._breakout(nb, self.parts, scale, warn_on, part_ratio, min_rise)
                if brk is not None:
                    noise = self.noise(max((i for i, s in enumerate(self.scales)
                                            if s <= scale), default=0))
                    return Evidence(scale, brk / scale, brk, noise, True, True, True)
        return ev

    def _load_end(self, at, reach: int) -> int:
        """Blocks back to the end of the load (the block after its last step may hold its
        tail), within reach."""
        return min(self._since_steep(0, reach, at) - 1, reach)

    def _whole(self, n: int, warn_on: float, min_rise: float, part_ratio: float,
               steady_ratio: float) -> tuple[Evidence, bool]:
        """The growth over the last n blocks of the retained memory, judged as a whole, and
        whether its second half rose faster than its first."""
        f = self.floor
        rise = f.at(0) - f.at(n)  # type: ignore[operator]
        scale = n * f.block_s
        i = max((i for i, s in enumerate(self.scales) if s <= scale), default=0)
        noise = self.noise(i)
        rising = rise >= max(self.min_rise, self.noise_factor * noise)
        shaped = sped_up = False
        if rising and rise >= max(warn_on * scale, min_rise):
            marks = [f.at(n - round(j * n / self.parts)) for j in range(self.parts + 1)]
            half = n // 2
            step = 1 + n // 64
            first = theil_sen((-j, f.at(j)) for j in range(n, half - 1, -step))
            second = theil_sen((-j, f.at(j)) for j in range(half, -1, -step))
            # and it still grows: a load that has ended is flat since
            recent = f.at(0) - f.at(min(2, n))  # type: ignore[operator]
            shaped = (recent >= self.part_share * rise * min(2, n) / n
                      and self._steps_ok(marks, rise, part_ratio) and first is not None
                      and second is not None and first > 0
                      and second >= steady_ratio * first)
            sped_up = first is not None and second is not None and second > first
        return Evidence(scale, rise / scale, rise, noise, rising, shaped), sped_up

    def _breakout(self, n: int, parts: int, scale: float, warn_on: float,
                  part_ratio: float = 0.0, least: float = 0.0) -> float | None:
        """The rise of the block values' part minima over the scale, when it is more than
        noise_factor x the series' largest give-back (and least) and shaped like a leak."""
        lows = self.floor.lows
        parts = max(parts, 3)
        if len(lows) <= n:
            return None
        base = len(lows) - n
        mins = [min(lows[i] for i in range(base + round(j * n / parts),
                                           base + round((j + 1) * n / parts)))
                for j in range(parts)]
        rise = mins[-1] - mins[0]
        span = scale * (parts - 1) / parts
        if rise < max(warn_on * span, self.min_rise, least, self.noise_factor * self.give_back):
            return None
        if not self._steps_ok(mins, rise, part_ratio):
            return None
        return rise * parts / (parts - 1)  # over the whole scale, at that pace

    def _shaped(self, n: int, parts: int, rise: float, since: int | None) -> bool:
        f = self.floor
        long = parts == 2
        # parts no shorter than the floor window: within it the floor moves as troughs come
        # and go (a staircase under a sawtooth), not only as memory is kept; on the scales
        # confirmed over half their length, nor than the gaps between the steps of a leak
        # kept in steps (each part holds one of them)
        parts = min(parts, n // f.window)
        gap = self._step_gap(n) if n * f.block_s >= self.staircase_from else 1
        parts = min(parts, n // gap)
        if parts < 2:
            return False
        # in quarters, or in thirds (a leak kept in steps a third of the scale apart)
        for k in (parts, parts - 1) if parts >= 4 else (parts,):
            marks = [f.at(n - round(j * n / k)) for j in range(k + 1)]
            if self._steps_ok(marks, rise):
                break
        else:
            return False
        # levelling off does not count: the second half rose levelling_ratio of the first
        half = n // 2
        mid = f.at(half)
        first, second = mid - marks[0], marks[-1] - mid  # type: ignore[operator]
        if second < self.levelling_ratio * first:
            return False
        # and it keeps the pace of what came before it, back to the end of loading
        reach = len(f) if since is None else since
        before_n = min(max(half, self.lookback), reach - n, len(f) - 1 - n)
        if before_n < half:
            # too little before it to compare paces with: on the scales judged in quarters,
            # a pace, not a few steps (a ratchet's steps right after loading) — most of its
            # blocks rose, or it rose in regular steps; the long scales judge a leak kept in
            # steps minutes apart
            return long or self._paced(n) or gap > 1
        # robust slopes (a staircase under a sawtooth moves in steps, not in a line), on at
        # most 32 points each
        recent = theil_sen((-j, f.at(j)) for j in range(n, -1, -(1 + n // 32)))
        before = theil_sen((-j, f.at(j))
                           for j in range(n + before_n, n - 1, -(1 + before_n // 32)))
        return recent is not None and before is not None and (
            recent >= self.steady_ratio * before)

    def _steps(self, n: int) -> list[tuple[int, float]]:
        """The retained memory's steps within the last n blocks, newest first: (blocks ago,
        rise) of each run of blocks that rose beyond the floor's tolerance (a step that
        straddles two blocks is one)."""
        f = self.floor
        out: list[tuple[int, float]] = []
        for j in range(n):
            up = f.at(j) - f.at(j + 1)  # type: ignore[operator]
            if up <= f.tol:
                continue
            if out and out[-1][0] == j - 1:
                out[-1] = (j, out[-1][1] + up)
            else:
                out.append((j, up))
        return out

    def _step_gap(self, n: int) -> int:
        """The gap, in blocks, between the steps of a leak kept in steps, where the last n
        blocks are one: the retained memory rose in two steps at least, alike in size and
        evenly spaced (within a factor of two), with no longer stretch without one before
        the first or after the last; 1 otherwise (a ramp rises in every block, or too
        slowly for a block to show it; a ratchet's records come ever more rarely and grow;
        steps that stopped are no staircase now). The longest gap: each part holds a step."""
        steps = self._steps(n)
        if len(steps) < 2:
            return 1
        gaps = [b - a for (a, _), (b, _) in pairwise(steps)]
        rises = [r for _, r in steps]
        edges = (steps[0][0] + 1, n - steps[-1][0])
        if max(rises) > 2 * min(rises) or max(*gaps, *edges) > 2 * min(gaps):
            return 1
        return max(gaps)

    def _paced(self, n: int) -> bool:
        """Whether most blocks of the last n rose beyond the floor's tolerance."""
        f = self.floor
        ups = sum(1 for j in range(n) if f.at(j) - f.at(j + 1) > f.tol)  # type: ignore[operator]
        return 2 * ups >= n

    def _since_pause(self, reach: int) -> int | None:
        """Blocks back to the end of the newest pause within reach: three blocks in a row
        within the floor's tolerance of each other, after memory grew (None: none)."""
        f = self.floor
        for j in range(0, reach - 2):
            a, m, z = f.at(j), f.at(j + 1), f.at(j + 2)
            if max(a, m, z) - min(a, m, z) <= f.tol and f.at(j) - f.at(reach) > self.min_rise:
                return j
        return None

    def _since_steep(self, n: int, reach: int | None = None, at=None) -> int:
        """Blocks back to the end of the series' load: the most recent block before the
        window that rose by half the largest rise of a block and by twice the median rise
        of the blocks after it, with the blocks right after it that still rose, to the
        newest that rose by min_rise and four times that (a load is a few large steps, or
        a steep climb, then a slower pace or none: a leak from the start keeps its pace
        through the load and after it, and may be half as fast as the load; the first burst
        of a ratchet as serving starts is the load's tail). A leak from the first second
        has no load: all of its history. at: the values (the retained memory's, unless
        given)."""
        f = self.floor
        at = at or f.at

        def low(j: int) -> float:  # with the two blocks after it: a lone block lifted by churn
            return min(at(i) for i in range(max(0, j - 2), j + 1))  # type: ignore[type-var]

        end = len(f) - 1 if reach is None else min(reach, len(f) - 1)
        rises = [low(j) - low(j + 1) for j in range(n, end)]
        if not rises:
            return n
        top = max(rises)
        if top <= 0:
            return end
        # rises[j] is the rise into the block n + j blocks back: the newest steep one, far
        # above the pace after it (two blocks at least: a pace, not the step's own tail)
        after: list[float] = []
        medians = []  # the median rise of the blocks after each
        for r in rises:
            medians.append(after[len(after) // 2] if len(after) >= 2 else math.inf)
            insort(after, r)
        last = next((j for j, r in enumerate(rises) if r >= 0.5 * top
                     and r >= 2 * medians[j]), None)
        if last is None:
            return end
        # and it goes on through the blocks right after it that still rose (beyond the
        # floor's tolerance), to the newest of them that rose by min_rise and four times the
        # pace after it: the load's tail (the first burst of a ratchet's cached shapes as
        # serving starts); a step after a flat stretch (a staircase) is not
        j = last
        while j > 0 and rises[j - 1] > f.tol:
            j -= 1
            if rises[j] >= self.min_rise and rises[j] >= 4 * medians[j]:
                last = j
        return n + last

    def _steps_ok(self, marks, rise: float, part_ratio: float = 0.0) -> bool:
        """Every step between marks rose its share, none carries most of the rise (fewer
        parts may carry more each: max_part_share of four), the slowest at least part_ratio
        of the fastest."""
        steps = [b - a for a, b in pairwise(marks)]
        k = len(steps)
        share = 1 - (1 - self.max_part_share) * (k - 1) / max(1, self.parts - 1)
        if min(steps) < self.part_share * rise / k or max(steps) > share * rise:
            return False
        return not (part_ratio and min(steps) < part_ratio * max(steps))
