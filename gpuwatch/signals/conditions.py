"""Turn per-tick judgements into firing/resolved events, once per transition."""

from __future__ import annotations

from gpuwatch.events import Event


class Conditions:
    """Tracks active conditions by key; emits an event only when one changes.

    A condition that escalates (warning -> critical) or de-escalates emits a new firing
    event with the new severity; one that stops being reported resolves.
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
                message=f"{prev.signal} resolved",
            )
            return [resolved]
        if prev is not None and prev.severity == ev.severity:
            # Keep the first firing event but refresh its value for /api/state.
            prev.value = ev.value
            return []
        self.active[key] = ev
        return [ev]

    def retain(self, t: float, keep) -> list[Event]:
        """Resolve every active condition whose key fails keep(key) (its subject is gone)."""
        out: list[Event] = []
        for key in [k for k in self.active if not keep(k)]:
            out += self.set(t, None, key)
        return out
