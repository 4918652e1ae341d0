"""Time to OOM from the GPU's own memory: the retained memory of everything on the GPU,
projected against its budget, whether or not any one process is judged leaking.

The GPU's retained memory is the sum of its members' retained memory (each process's
floor, signals/leak/floor.py, and the memory no process accounts for; or the GPU's used
memory alone when the driver gives no per-process figures), one point per block. A member
that joins is taken as if it had always held what it first held, and one that leaves as if
it had never been there: a process starting or exiting is not growth. Planned pools are
already in the members' floors (a pool growing to its plan is not growth).

The sum is judged by the same tests as one series (signals/leak/scales.py), on the sum's
longer scales (sum_window_factor): it must rise
beyond the sum's own noise and the minimum rise, through all of its window and keeping its
pace, at the warning slope at least (a time to OOM is shown only then; the horizons judge
it).
Growth of processes that may still be loading (before their first pause, younger than
loading_max_seconds) is left out of the sum: a load ends where its weights end, it is no
pace to project (a restart loading its weights again on a full GPU is not an OOM coming).
A process that goes on growing past that age counts again, from its memory then.

Names the members whose retained memory rose most over the scale judged. Work per block is
O(members x the longest scale); nothing per tick but the members' latest floors.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from gpuwatch.signals.config import LeakConfig
from gpuwatch.signals.leak.floor import BlockPoints
from gpuwatch.signals.leak.scales import Evidence, Scales
from gpuwatch.signals.leak.series import confirm_time

UNATTRIBUTED = -1  # the member for memory no process accounts for


class SumSeries(BlockPoints):
    """The interface Scales reads (signals/leak/floor.py), over a sum of members."""

    def __init__(self, block_s: float, keep: int) -> None:
        self.block_s = block_s
        self.keep = keep
        self.window = 1
        self.max_blocks = 1
        self.tol = 0.0
        self.points: deque[float] = deque(maxlen=keep)
        self.k_last: int | None = None

    @property
    def lows(self) -> deque[float]:
        return self.points

    @property
    def period(self) -> float:
        return self.block_s

    def set(self, k: int, values) -> None:
        self.points.clear()
        self.points.extend(values)
        self.k_last = k


@dataclass(frozen=True)
class Projection:
    rate: float  # bytes/s
    scale: float
    risers: tuple[tuple[int, float], ...]  # (member, rise over the scale), largest first


class GpuProjection:
    def __init__(self, cfg: LeakConfig, least_rate: float) -> None:
        self.cfg = cfg
        self.least = least_rate  # the slowest growth projected (the warning slope)
        self.block_s = cfg.block_seconds
        self.keep = round(2 * max(cfg.scales_seconds) / self.block_s) + 1
        # member -> its retained memory per block, and the same since it stopped loading
        # (backfilled flat: its loading is not growth of the stable sum)
        self._raw: dict[int, deque[float]] = {}
        self._stable: dict[int, deque[float]] = {}
        self._k: int | None = None
        self._latest: dict[int, tuple[float, bool]] = {}
        self.stable = self._scales()
        self._since: dict[float, float] = {}
        self.current: Projection | None = None

    def _scales(self) -> Scales:
        c = self.cfg
        return Scales(c.scales_seconds, SumSeries(self.block_s, self.keep),  # type: ignore[arg-type]
                      parts=c.parts, part_share=c.part_share, max_part_share=c.max_part_share,
                      steady_ratio=c.steady_ratio, lookback_s=c.lookback_seconds,
                      min_rise=c.min_rise_bytes, noise_factor=c.noise_factor,
                      long_scale_s=c.long_scale_seconds, levelling_ratio=c.levelling_ratio)

    def due(self, t: float) -> bool:
        """Whether a block closed since the last update (the members are read only then)."""
        return self._k != math.floor(t / self.block_s)

    def update(self, t: float, members: dict[int, tuple[float | None, bool]],
               headroom: float | None) -> Projection | None:
        """members: id -> (its retained memory now, None while unknown; whether it may still
        be loading). Returns the projection in force (None: memory is not growing so)."""
        latest = self._latest
        for m, (v, loading) in members.items():
            if v is not None:
                latest[m] = (v, loading)
        for m in [m for m in latest if m not in members]:
            del latest[m]
        k = math.floor(t / self.block_s)
        first = self._k is None
        self._k = k
        if not first:
            self._block(k, t, headroom)
        return self.current

    def _block(self, k: int, t: float, headroom: float | None) -> None:
        raw, stable, latest, keep = self._raw, self._stable, self._latest, self.keep
        for m in [m for m in raw if m not in latest]:
            del raw[m]  # gone: as if it had never been there
            stable.pop(m, None)
        n = len(self.stable.floor) + 1
        for m, (v, loading) in latest.items():
            h = raw.get(m)
            if h is None:  # new: as if it had always held this much
                h = raw[m] = deque([v] * (n - 1), maxlen=keep)
            h.append(v)
            if loading:
                stable.pop(m, None)
            elif m not in stable:
                stable[m] = deque([v] * len(h), maxlen=keep)
            else:
                stable[m].append(v)
        n = min(max((len(h) for h in raw.values()), default=0), keep)
        self.stable.floor.set(k, _sum(stable.values(), n))  # type: ignore[attr-defined]
        self.current = self._judge(t, headroom)

    def _judge(self, t: float, headroom: float | None) -> Projection | None:
        if headroom is None:
            return None
        c = self.cfg
        best: Evidence | None = None
        for e in self.stable.update(self.least):
            if not e.shaped:
                self._since.pop(e.scale, None)
                continue
            since = self._since.setdefault(e.scale, t)
            if t - since < confirm_time(c, e.scale):
                continue
            if best is None or e.rate > best.rate:
                best = e
        if best is None:
            return None
        n = round(best.scale / self.block_s)
        risers = sorted(((m, h[-1] - h[-1 - n]) for m, h in self._stable.items()
                         if len(h) > n and h[-1] - h[-1 - n] > 0), key=lambda x: -x[1])[:3]
        return Projection(best.rate, best.scale, tuple(risers))


def _sum(hists, n: int) -> list[float]:
    """Element-wise sum of the last n values of each history, aligned on the newest."""
    out = [0.0] * n
    for h in hists:
        off = n - len(h)
        for i, v in enumerate(h):
            if i + off >= 0:
                out[i + off] += v
    return out
