"""Turn per-tick judgements into firing/resolved events, once per transition."""

from __future__ import annotations

from gpuwatch.events import Event
from gpuwatch.logfmt import iso


class Conditions:
    """Tracks active conditions by key; emits an event only when one changes.

    Published events are never modified. A condition that escalates (warning -> critical)
    or de-escalates emits a new firing event with the new severity, whose `ref` is the
    event it supersedes; one that stops being reported resolves with a new event whose
    `ref` is the firing event it ends. Hysteresis (enter/exit levels, minimum hold) lives
    in the analyzers: what reaches here is already the verdict.
    """

    def __init__(self) -> None:
        self.active: dict[tuple, Event] = {}

    def set(self, t: float, ev: Event | None, key: tuple) -> list[Event]:
        """ev is the current finding for key (None: the condition does not hold)."""
        prev = self.active.get(key)
        if ev is None:
            if prev is None:
                return []
            del self.active[key]
            resolved = Event(
                t=t, signal=prev.signal, state="resolved", severity=prev.severity,
                gpu_uuid=prev.gpu_uuid, pid=prev.pid, engine=prev.engine,
                value=prev.value, threshold=prev.threshold,
                message=f"{prev.signal} resolved (fired at {iso(prev.t)}: {prev.message})",
            )
            return [resolved.published(ref=prev.id)]
        if prev is not None and prev.severity == ev.severity:
            return []  # the same episode goes on
        published = ev.published(ref=prev.id if prev is not None else None)
        self.active[key] = published
        return [published]

    def amend(self, old: Event, new: Event) -> None:
        """Hold `new` instead of `old` (not yet published: the pipeline adds what it knows
        of the process's owner before anyone sees the event)."""
        for key, ev in self.active.items():
            if ev is old:
                self.active[key] = new

    def retain(self, t: float, keep) -> list[Event]:
        """Resolve every active condition whose key fails keep(key) (its subject is gone)."""
        out: list[Event] = []
        for key in [k for k in self.active if not keep(k)]:
            out += self.set(t, None, key)
        return out


class Hold:
    """A level with a minimum hold: a higher level is taken at once, a lower one only after
    it has held for hold_seconds without a break (its exit level is the caller's)."""

    def __init__(self) -> None:
        self.level = 0
        self._lower_since: float | None = None

    def update(self, t: float, level: int, hold_seconds: float) -> int:
        if level >= self.level:
            self.level, self._lower_since = level, None
        elif self._lower_since is None:
            self._lower_since = t
        if self._lower_since is not None and t - self._lower_since >= hold_seconds:
            self.level, self._lower_since = level, None
        return self.level
