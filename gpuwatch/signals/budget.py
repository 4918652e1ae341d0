"""Which processes get series of their own: the series budget per host.

A host with hundreds of processes would export every per-process family for each of them, and
a new set at every pid restart. Only the processes that matter keep theirs; the exporter sums
the rest per GPU and owner (exporter/fold.py). A process matters, in this order:

1. it must stay (never folded, whatever the cap): a probe reports on it, it has an active
   event or one within `recent_event_seconds`, or it was ever judged (a leak verdict above
   none: its verdict series then stays on every scrape until it exits, so that no alert's
   `for:` restarts on a gap);
2. it qualifies: among the `top_k` by GPU memory on its GPU, or not yet steady (loading,
   warming up). It keeps its series for `hold_seconds` after it last qualified, so that a
   process moving in and out of the top K does not flap its series; at most `max_processes`
   per host, those that must stay included: those qualifying now first, then those held,
   processes that already have series first in each.

Pure over ticks and events (replay computes the same selection as the live run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from gpuwatch.events import Event
from gpuwatch.model import Tick

NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]

Key = tuple[str, int]  # (GPU uuid, pid)
NOT_STEADY = ("loading", "warmup")


class BudgetConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Off: every process has its own series (as before the budget).
    enabled: bool = True
    # Per GPU, the processes using the most GPU memory.
    top_k: NonNegInt = 3
    # Per host: processes with series of their own, those that must stay included (they are
    # never folded, even beyond it).
    max_processes: NonNegInt = 32
    # A process keeps its series this long after it last qualified (hysteresis).
    hold_seconds: NonNegFloat = 900.0
    # An event about a process keeps its series this long after it (an OOM's counter lives
    # an hour too).
    recent_event_seconds: NonNegFloat = 3600.0


@dataclass
class Selection:
    """What the budget decided on the last tick; None fields: no budget (export all)."""

    exported: frozenset[Key] | None = None
    folded: dict[str, int] = field(default_factory=dict)  # uuid -> processes folded
    reasons: dict[Key, str] = field(default_factory=dict)  # why each exported one is


class Budget:
    def __init__(self, cfg: BudgetConfig) -> None:
        self.cfg = cfg
        self._qualified_at: dict[Key, float] = {}
        self._event_at: dict[Key, float] = {}
        self._judged: set[Key] = set()
        self._exported: frozenset[Key] = frozenset()

    def update(self, tick: Tick, derived, events: list[Event],
               active: list[Event]) -> Selection:
        cfg = self.cfg
        if not cfg.enabled:
            return Selection()
        t = tick.t
        for ev in (*events, *active):
            if ev.pid is not None and ev.gpu_uuid is not None:
                self._event_at[(ev.gpu_uuid, ev.pid)] = t
        if not tick.gpus:  # nothing sampled: keep the last decision
            return Selection(exported=self._exported)
        live: dict[Key, int] = {}
        probed = {p.pid for p in tick.probes}
        must: dict[Key, str] = {}
        for g in tick.gpus:
            ranked = sorted(g.processes, key=lambda p: (-(p.used_memory_bytes or 0), p.pid))
            for rank, p in enumerate(ranked):
                key = (g.uuid, p.pid)
                live[key] = p.used_memory_bytes or 0
                sig = derived.processes.get(key)
                if sig is not None and (sig.leak_severity or 0) > 0:
                    self._judged.add(key)
                if key in self._judged:
                    must[key] = "judged"
                elif p.pid in probed:
                    must[key] = "probe"
                elif t - self._event_at.get(key, -1e300) <= cfg.recent_event_seconds:
                    must[key] = "event"
                elif rank < cfg.top_k or (sig is not None and sig.phase in NOT_STEADY):
                    self._qualified_at[key] = t
        self._forget(live, derived)
        held = [k for k in live if k not in must
                and t - self._qualified_at.get(k, -1e300) <= cfg.hold_seconds]
        # those qualifying now, then those held; series already there first (no churn),
        # then by memory
        held.sort(key=lambda k: (self._qualified_at[k] != t, k not in self._exported,
                                 -live[k], k))
        slots = max(cfg.max_processes - len(must), 0)
        reasons = dict(must)
        reasons.update((k, "qualified" if self._qualified_at[k] == t else "held")
                       for k in held[:slots])
        # A process that ran out of memory keeps its OOM counter after it died of it (the
        # OOM alert reads increase() over it), for as long as its tally is kept.
        reasons.update((k, "oom") for k in getattr(derived, "ooms", {}) if k not in reasons)
        self._exported = frozenset(reasons)
        folded: dict[str, int] = {g.uuid: 0 for g in tick.gpus}
        for uuid, _ in (k for k in live if k not in reasons):
            folded[uuid] += 1
        return Selection(exported=self._exported, folded=folded, reasons=reasons)

    def _forget(self, live: dict[Key, int], derived) -> None:
        """Exited processes leave; an event's memory outlives its process only as long as
        the OOM tally that names it."""
        for k in [k for k in self._qualified_at if k not in live]:
            del self._qualified_at[k]
        self._judged &= set(live)
        keep = set(live) | set(getattr(derived, "ooms", {}))
        for k in [k for k in self._event_at if k not in keep]:
            del self._event_at[k]
