"""What every section of the report shares: where an event or action happened, times
relative to the recording's start, chart markers for events and actions."""

from __future__ import annotations

from gpuwatch.events import ActionEvent
from gpuwatch.views import fmt
from gpuwatch.views.report.collect import Collector, GpuView
from gpuwatch.views.svg import Marker

MAX_EVENT_ROWS = 400
SEV_COLOR = {"warning": "var(--warn)", "critical": "var(--crit)"}


def where(ev, gpus: dict[str, GpuView], names: dict[int, str]) -> str:
    return place(getattr(ev, "gpu_uuid", None), getattr(ev, "pid", None),
                 getattr(ev, "engine", None), gpus, names)


def place(uuid, pid, engine, gpus: dict[str, GpuView], names: dict[int, str]) -> str:
    labels = {u: f"GPU {g.index} {g.name}" for u, g in gpus.items()}
    return fmt.place(uuid, pid, engine, labels, names)


def rel_time(t: float, t0: float) -> str:
    return f"{fmt.clock(t)} <span class=muted>(+{fmt.duration(t - t0)})</span>"


def event_markers(events, match, y_of) -> list[Marker]:
    out = []
    for ev in events:
        if not match(ev):
            continue
        if isinstance(ev, ActionEvent):
            out.append(Marker(ev.t, None, "var(--accent)", f"{fmt.clock(ev.t)} action "
                              f"{ev.action}: {ev.result} ({ev.reason or ev.trigger})",
                              "diamond"))
        elif ev.state == "resolved":
            out.append(Marker(ev.t, y_of(ev), "var(--safe)",
                              f"{fmt.clock(ev.t)} resolved {ev.signal}: {ev.message}", "circle"))
        else:
            out.append(Marker(ev.t, y_of(ev), SEV_COLOR.get(ev.severity, "var(--warn)"),
                              f"{fmt.clock(ev.t)} {ev.severity} {ev.signal}: {ev.message}"))
    return out


def action_on(c: Collector, ev: ActionEvent, uuid: str, pid: int | None) -> bool:
    _, g, p, _ = c.action_where.get(id(ev), (None,) * 4)
    return g == uuid and (pid is None or p == pid)


def taken_or_planned(c: Collector, a: ActionEvent) -> str:
    return "taken" if id(a) in c.taken else "planned"


def action_target(a: ActionEvent, c: Collector) -> str:
    _, uuid, pid, engine = c.action_where.get(id(a), (None,) * 4)
    if uuid or pid is not None or engine:
        return place(uuid, pid, engine, c.gpus, c.names)
    return a.target
