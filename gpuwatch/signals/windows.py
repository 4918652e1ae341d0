"""Counters that survive engine restarts, sliding windows over them, histogram quantiles.

Pure and deterministic: time is whatever the caller passes in.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

# Defaults of the bounds on what an engine's exposition can make gpuwatch remember. The label
# values that split counters into groups are chosen by the remote endpoint, so both the number
# of groups and their lifetime are bounded.
MAX_GROUPS = 512  # series groups (data-parallel ranks, Triton models) per engine process
EXPIRE_SCRAPES = 60  # a group (or a process) not seen for this many scrapes is folded away
MAX_PROCESSES = 4  # processes (process_start_time_seconds values) remembered per engine
MAX_RETIRED_NAMES = 1024  # counter names whose folded totals are kept
MAX_MODELS = 64  # models whose totals are kept apart (the rest are summed as model "")


def _fold(into: dict[str, float], values: dict[str, float]) -> None:
    for name, v in values.items():
        if name in into or len(into) < MAX_RETIRED_NAMES:
            into[name] = into.get(name, 0.0) + v


class CounterBank:
    """Engine counters made monotonic across restarts, with bounded memory.

    Counters come in groups (one engine core, one Triton model) whose counters reset
    together. When any counter of a group goes down, or the caller says the process
    restarted, the whole group has reset: each counter's last value is kept as an offset,
    so total = offset + current value never decreases. A group that disappears keeps
    contributing its last total: after `expire_after` scrapes without it, that total is
    folded into one per-name sum and the group is forgotten. At most `max_groups` groups
    are tracked; the groups of a scrape beyond that are refused (counted in `refused`).
    """

    def __init__(self, max_groups: int = MAX_GROUPS, expire_after: int = EXPIRE_SCRAPES) -> None:
        self.max_groups = max_groups
        self.expire_after = expire_after
        self.last: dict[str, dict[str, float]] = {}
        self.offset: dict[str, dict[str, float]] = {}
        self.seen: dict[str, int] = {}  # group -> the scrape that last had it
        self.retired: dict[str, float] = {}  # folded totals of forgotten groups
        self.model: dict[str, str] = {}  # group -> the model it counts for ("" = the engine's)
        self.retired_by_model: dict[str, dict[str, float]] = {}
        self.scrapes = 0
        self.resets = 0
        self.refused = 0  # groups refused by the cap in the last update

    def update(self, groups: dict[str, dict[str, float]], restarted: bool = False,
               models: dict[str, str] | None = None) -> bool:
        """Take one scrape's raw values; returns True if any group reset. models: the model
        each group counts for, where the engine serves several."""
        self.scrapes += 1
        self.refused = 0
        reset_any = False
        for group, values in groups.items():
            last = self.last.get(group)
            if last is None:
                if len(self.last) >= self.max_groups:
                    self.refused += 1
                    continue
                self.last[group] = dict(values)
                self.seen[group] = self.scrapes
                model = (models or {}).get(group, "")
                if model:
                    self.model[group] = model
                continue
            self.seen[group] = self.scrapes
            if restarted or any(v < last.get(name, 0.0) for name, v in values.items()):
                reset_any = True
                off = self.offset.setdefault(group, {})
                for name, prev in last.items():
                    off[name] = off.get(name, 0.0) + prev
            last.update(values)
        self._expire()
        if reset_any:
            self.resets += 1
        return reset_any

    def _expire(self) -> None:
        horizon = self.scrapes - self.expire_after
        for group in [g for g, n in self.seen.items() if n <= horizon]:
            self.fold(group)

    def fold(self, group: str) -> None:
        """Forget a group, keeping its total in the per-name sum (and its model's)."""
        total = self.group_total(group)
        _fold(self.retired, total)
        model = self.model.pop(group, "")
        if model and (model in self.retired_by_model
                      or len(self.retired_by_model) < MAX_MODELS):
            _fold(self.retired_by_model.setdefault(model, {}), total)
        self.last.pop(group, None)
        self.offset.pop(group, None)
        self.seen.pop(group, None)

    def group_total(self, group: str) -> dict[str, float]:
        off = self.offset.get(group, {})
        return {name: v + off.get(name, 0.0) for name, v in self.last.get(group, {}).items()}

    def totals(self) -> dict[str, float]:
        out = dict(self.retired)
        for group, values in self.last.items():
            off = self.offset.get(group, {})
            for name, v in values.items():
                out[name] = out.get(name, 0.0) + v + off.get(name, 0.0)
        return out

    def totals_by_model(self) -> dict[str, dict[str, float]]:
        """Totals per model (groups of no model, or beyond MAX_MODELS models, under "")."""
        out: dict[str, dict[str, float]] = {m: dict(v) for m, v in self.retired_by_model.items()}
        for group in self.last:
            model = self.model.get(group, "")
            if model not in out and len(out) >= MAX_MODELS:
                model = ""
            _add_into(out.setdefault(model, {}), self.group_total(group))
        return out


def _add_into(into: dict[str, float], values: dict[str, float]) -> None:
    for name, v in values.items():
        into[name] = into.get(name, 0.0) + v


class EngineCounters:
    """The counters behind one engine URL, kept per process.

    A process is told apart by process_start_time_seconds. A new start time is a restart:
    the old process's totals stay as they were (its bank is kept, then folded), the new one
    counts from its own values. A start time that comes back after another one answered
    means several processes (replicas) answer at one URL: not restarts, and each
    replica's counters stay monotonic in its own bank, so the totals are their sum.
    """

    def __init__(self, max_groups: int = MAX_GROUPS, expire_after: int = EXPIRE_SCRAPES,
                 max_processes: int = MAX_PROCESSES) -> None:
        self.max_groups = max_groups
        self.expire_after = expire_after
        self.max_processes = max_processes
        self.banks: dict[float | None, CounterBank] = {}
        self.seen: dict[float | None, int] = {}  # process -> the scrape that last had it
        self.retired: dict[str, float] = {}
        self.retired_by_model: dict[str, dict[str, float]] = {}
        self.current: float | None = None
        self.scrapes = 0
        self.flap_at: int | None = None  # the last scrape where a known process came back
        # the last update's counters went backwards with no start time to say why
        self.blind_reset = False
        self._counted: set[float | None] = set()  # processes counted as a restart

    @property
    def refused(self) -> int:
        bank = self.banks.get(self.current)
        return bank.refused if bank is not None else 0

    def update(self, start_time: float | None, groups: dict[str, dict[str, float]],
               models: dict[str, str] | None = None) -> int:
        """Take one scrape; returns the change in detected restarts (negative when
        processes counted as restarts turn out to be replicas)."""
        self.scrapes += 1
        key = start_time if start_time is not None else self.current
        delta = 0
        if key not in self.banks:
            if self.banks:
                delta += 1
                self._counted.add(key)
            self.banks[key] = CounterBank(self.max_groups, self.expire_after)
        elif key != self.current:
            self.flap_at = self.scrapes
            for k in (key, self.current):
                if k in self._counted:
                    self._counted.discard(k)
                    delta -= 1
        self.current = key
        self.seen[key] = self.scrapes
        self.blind_reset = False
        if self.banks[key].update(groups, models=models):
            delta += 1
            self.blind_reset = start_time is None
        self._expire()
        return delta

    def _expire(self) -> None:
        horizon = self.scrapes - self.expire_after
        stale = [k for k, n in self.seen.items() if n <= horizon and k != self.current]
        by_age = sorted((k for k in self.seen if k != self.current), key=self.seen.__getitem__)
        stale += by_age[: max(len(self.seen) - self.max_processes, 0)]
        for key in dict.fromkeys(stale):
            bank = self.banks.pop(key)
            _fold(self.retired, bank.totals())
            for model, values in bank.totals_by_model().items():
                if model in self.retired_by_model or len(self.retired_by_model) < MAX_MODELS:
                    _fold(self.retired_by_model.setdefault(model, {}), values)
            del self.seen[key]
            self._counted.discard(key)

    def replicas(self) -> int:
        """How many processes answer at the URL (1 unless their start times alternate)."""
        if self.flap_at is None or self.scrapes - self.flap_at >= self.expire_after:
            return 1
        return max(len(self.seen), 2)

    def groups(self) -> int:
        return sum(len(b.last) for b in self.banks.values())

    def totals(self) -> dict[str, float]:
        out = dict(self.retired)
        for bank in self.banks.values():
            _add_into(out, bank.totals())
        return out

    def totals_by_model(self) -> dict[str, dict[str, float]]:
        """Totals per model across the processes, folded ones included."""
        out = {m: dict(v) for m, v in self.retired_by_model.items()}
        for bank in self.banks.values():
            for model, values in bank.totals_by_model().items():
                _add_into(out.setdefault(model, {}), values)
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
    A quantile in the +Inf bucket is the highest finite bound, as in PromQL. Durations and
    sizes are never negative: where PromQL would answer a negative bucket bound (an
    exposition with le < 0), the answer is 0.
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
        return max(bounds[-2], 0.0)
    if b == 0 and bounds[0] <= 0:
        return 0.0
    start = 0.0
    end = bounds[b]
    count = mono[b]
    if b > 0:
        start = bounds[b - 1]
        count -= mono[b - 1]
        rank -= mono[b - 1]
    if count <= 0:
        return max(end, 0.0)
    return max(start + (end - start) * (rank / count), 0.0)
