"""process_oom: one event per OOM a probe recorded (tick.ooms), naming what foretold it.

An OOM is an occurrence, not a condition: its event fires once and is never resolved (it is
not among the active conditions). Its `ref` is the first event of the episode that
predicted it on that GPU, where one did: the process's own memory_leak, the GPU's
time_to_oom or the GPU's own memory_leak, whichever began first; failing those, a
memory_zone episode (which warned of full memory, but predicted no OOM). `oom.lead_seconds`
is how long before the OOM that event fired: "predicted 14 min ago, happened now".

Severity: critical, except for a failure that never reached the program (a retry inside
torch got the memory: warning).

Pure: episodes are followed through the conditions the memory analyzer set on this and
earlier ticks (this analyzer runs after it); state is bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.events import Event, OomInfo
from gpuwatch.model import ATTRIBUTION_FIELDS, OomSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived, OomTally

PREDICTING = ("memory_leak", "time_to_oom")
WARNING = "memory_zone"
# An episode that ended this long before an OOM still counts as its forerunner.
ENDED_LOOKBACK_SECONDS = 120.0
RETAIN_SECONDS = 3600.0  # a tally is kept this long after its process's last OOM
MAX_TALLIES = 512
MAX_RECENT = 50
MAX_EPISODES = 4096
MIB = 1 << 20
GIB = 1 << 30


@dataclass
class _Episode:
    first: Event
    current: str  # the id of its latest event (an escalation supersedes the one before)
    ended: float | None = None


def size_text(n: float | None) -> str:
    if n is None:
        return "?"
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    return f"{n / 1024:.0f} KiB"


def duration_text(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


class OomAnalyzer:
    def __init__(self, config=None) -> None:
        self._episodes: dict[tuple, _Episode] = {}

    def update(self, tick: Tick, derived: Derived, conditions: Conditions) -> list[Event]:
        self._follow(tick.t, conditions)
        if not tick.ooms and not derived.ooms:
            return []
        index = {g.uuid: g.index for g in tick.gpus}
        events = []
        for oom in sorted(tick.ooms, key=lambda o: (o.t, o.pid, o.seq)):
            ev = self.event(oom, index.get(oom.gpu_uuid or ""))
            events.append(ev)
            self._tally(derived, oom, ev, index.get(oom.gpu_uuid or ""))
        self._expire(tick, derived)
        return events

    # -- episodes of the signals that foretell an OOM ---------------------------------------
    def _follow(self, t: float, conditions: Conditions) -> None:
        live = set()
        for key, ev in conditions.active.items():
            if key[0] not in PREDICTING and key[0] != WARNING:
                continue
            live.add(key)
            ep = self._episodes.get(key)
            if ep is None or ep.ended is not None:
                self._episodes[key] = _Episode(ev, ev.id)
            elif ep.current != ev.id:
                if ev.ref == ep.current:
                    ep.current = ev.id  # escalated: the same episode
                else:
                    self._episodes[key] = _Episode(ev, ev.id)
        for key, ep in list(self._episodes.items()):
            if key in live:
                continue
            if ep.ended is None:
                ep.ended = t
            elif t - ep.ended > ENDED_LOOKBACK_SECONDS:
                del self._episodes[key]
        if len(self._episodes) > MAX_EPISODES:  # keep the live ones and the latest ended
            ended = sorted((ep.ended, k) for k, ep in self._episodes.items()
                           if ep.ended is not None)
            for _, k in ended[:len(self._episodes) - MAX_EPISODES]:
                del self._episodes[k]

    def forerunner(self, uuid: str | None, pid: int, t: float) -> tuple[_Episode | None, bool]:
        """(the episode that preceded an OOM at t, whether it predicted one)."""
        def usable(key: tuple) -> _Episode | None:
            ep = self._episodes.get(key)
            if ep is None or ep.first.t > t:
                return None
            if ep.ended is not None and ep.ended < t - ENDED_LOOKBACK_SECONDS:
                return None
            return ep
        # the earliest; on the same tick the process's own leak, then the GPU's verdicts
        found = [(ep.first.t, n, ep) for n, key in enumerate((
            ("memory_leak", uuid, pid, None), ("time_to_oom", uuid, None, None),
            ("memory_leak", uuid, None, None))) if (ep := usable(key)) is not None]
        if found:
            return min(found, key=lambda x: x[:2])[2], True
        return usable((WARNING, uuid, None, None)), False

    # -- the event ----------------------------------------------------------------------------
    def event(self, oom: OomSample, gpu_index: int | None) -> Event:
        ep, predicted = self.forerunner(oom.gpu_uuid, oom.pid, oom.t)
        lead = round(oom.t - ep.first.t, 3) if ep is not None else None
        info = OomInfo(
            request_bytes=oom.request_bytes, free_bytes=oom.device_free_bytes,
            total_bytes=oom.device_total_bytes, fragmentation_ratio=oom.fragmentation_ratio,
            cause=oom.cause, outcome=oom.outcome, exited=oom.exited, record=oom.record,
            history=oom.history,
            predicted_by=ep.first.signal if ep is not None and predicted else "",
            lead_seconds=lead if predicted else None,
            warned_by=ep.first.signal if ep is not None and not predicted else "")
        owner = {f: getattr(oom, f) for f in ATTRIBUTION_FIELDS if getattr(oom, f)}
        ev = Event(t=oom.t, signal="process_oom", state="firing",
                   severity="warning" if oom.outcome == "recovered" else "critical",
                   gpu_uuid=oom.gpu_uuid, pid=oom.pid, value=oom.request_bytes,
                   threshold=oom.device_free_bytes, message=message(oom, gpu_index, ep, lead),
                   oom=info, **owner)
        return ev.published(ref=ep.first.id if ep is not None else None)

    # -- what the exporter counts -------------------------------------------------------------
    def _tally(self, derived: Derived, oom: OomSample, ev: Event, index: int | None) -> None:
        key = (oom.gpu_uuid or "", oom.pid)
        tally = derived.ooms.get(key)
        if tally is None or tally.create_time != oom.create_time:
            tally = derived.ooms[key] = OomTally(create_time=oom.create_time)
        if index is not None:
            tally.gpu_index = index
        # the labels stay as first known: a counter whose labels change is another series
        tally.name = tally.name or oom.name
        tally.owner = {f: tally.owner.get(f) or getattr(oom, f) for f in ATTRIBUTION_FIELDS}
        pair = (oom.cause or "unknown", oom.outcome or "unknown")
        tally.counts[pair] = tally.counts.get(pair, 0) + 1
        tally.last_t = oom.t
        tally.last_lead_seconds = ev.oom.lead_seconds if ev.oom is not None else None
        derived.gpu_ooms[key[0]] = derived.gpu_ooms.get(key[0], 0) + 1
        derived.recent_ooms.append(ev)
        del derived.recent_ooms[:-MAX_RECENT]

    def _expire(self, tick: Tick, derived: Derived) -> None:
        present = {(g.uuid, p.pid) for g in tick.gpus for p in g.processes}
        for key in [k for k, v in derived.ooms.items()
                    if k not in present and tick.t - v.last_t > RETAIN_SECONDS]:
            del derived.ooms[key]
        if len(derived.ooms) > MAX_TALLIES:
            for key, _ in sorted(derived.ooms.items(),
                                 key=lambda kv: kv[1].last_t)[:len(derived.ooms) - MAX_TALLIES]:
                del derived.ooms[key]


def message(oom: OomSample, gpu_index: int | None, ep: _Episode | None,
            lead: float | None) -> str:
    who = f"pid {oom.pid} ({oom.name or '?'}) on GPU {'?' if gpu_index is None else gpu_index}"
    total = f" of {size_text(oom.device_total_bytes)}" if oom.device_total_bytes else ""
    text = (f"{who} ran out of GPU memory: a {size_text(oom.request_bytes)} request failed "
            f"with {size_text(oom.device_free_bytes)} free{total}")
    if oom.cause == "fragmentation":
        text += (f"; fragmentation: {size_text(oom.cached_free_bytes)} free in the allocator's "
                 f"segments, in pieces of at most {size_text(oom.largest_free_block_bytes)}: "
                 "enough in total, none large enough")
    elif oom.cause == "limit":
        text += f"; the process's own cap of {size_text(oom.allowed_bytes)} was reached"
    elif oom.cause == "full":
        held = size_text(oom.reserved_bytes)
        if oom.device_total_bytes and (oom.request_bytes or 0) > oom.device_total_bytes:
            # 'full' as the allocator sees it, but telling an operator the GPU was full
            # while most of it was free sends them looking for the wrong process
            text += f"; the request is larger than the whole GPU (this process reserved {held})"
        else:
            text += f"; the GPU was full (this process reserved {held})"
    if oom.fragmentation_ratio is not None:
        text += f"; fragmentation ratio {oom.fragmentation_ratio:.2f} at the OOM"
    text += {"raised": "; the program got the error", "caught": "; the program caught it",
             "recovered": "; a retry inside torch got the memory: the program never saw it",
             }.get(oom.outcome, "")
    if oom.exited:
        text += "; the process has exited"
    if ep is None or lead is None:
        text += ". gpuwatch had not predicted it"
    elif ep.first.signal in PREDICTING:
        text += (f". Predicted {duration_text(lead)} before, by {ep.first.signal} "
                 f"({ep.first.severity})")
    else:
        text += (f". Not predicted; the memory zone was {ep.first.severity} from "
                 f"{duration_text(lead)} before")
    if oom.record:
        text += f"; record: {oom.record}"
    return text
