"""The Findings section: one row per firing episode, with the actions that answered it."""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from gpuwatch.events import ActionEvent, Event
from gpuwatch.views import fmt
from gpuwatch.views.report.collect import Collector
from gpuwatch.views.report.common import rel_time, taken_or_planned, where


@dataclass
class Finding:
    first: Event
    severity: str
    last_value: float | None = None
    resolved: float | None = None
    ttoom: float | None = None
    actions: list[ActionEvent] = field(default_factory=list)


def findings(c: Collector) -> list[Finding]:
    """One row per firing episode (firing ... resolved of one condition), with the actions
    that answered it."""
    open_: dict[tuple, Finding] = {}
    out: list[Finding] = []
    for ev in c.events:
        if isinstance(ev, ActionEvent):
            f = open_.get(c.action_where.get(id(ev), ()))
            if f is not None:
                f.actions.append(ev)
            continue
        f = open_.get(ev.key)
        if ev.state == "firing":
            if f is None:
                f = open_[ev.key] = Finding(ev, ev.severity)
                out.append(f)
            elif ev.severity == "critical":
                f.severity = "critical"
            f.last_value = ev.value
        elif f is not None:
            f.resolved = ev.t
            del open_[ev.key]
    for f in out:
        if f.first.signal == "time_to_oom":
            f.ttoom = f.first.value
        sv = c.series.get((f.first.gpu_uuid, f.first.pid))
        if f.first.signal == "memory_leak" and sv is not None:
            f.ttoom = next((tr.ttoom for tr in sv.trends if tr.t_detect == f.first.t), None)
    return out


def summary(c: Collector, found: list[Finding]) -> str:
    if not found:
        return '<p class="card">No findings: nothing crossed a threshold in this recording.</p>'
    rows = []
    for f in found:
        ev = f.first
        state = (f'<span class="badge resolved">resolved {fmt.clock(f.resolved)}</span>'
                 if f.resolved else '<span class="badge ongoing">ongoing at end</span>')
        acts = ", ".join(f"{a.action}: {a.result} ({taken_or_planned(c, a)})"
                         for a in f.actions) or fmt.DASH
        rows.append(
            f'<tr class="finding" data-signal="{escape(ev.signal)}">'
            f'<td class="n">{rel_time(ev.t, c.t0)}</td>'
            f'<td><span class="badge {escape(f.severity)}">{escape(f.severity)}</span></td>'
            f"<td><b>{escape(ev.signal)}</b></td><td>{escape(where(ev, c.gpus, c.names))}</td>"
            f'<td class="n value">{escape(fmt.signal_value(ev.signal, ev.value))}</td>'
            f'<td class="n">{escape(fmt.signal_value(ev.signal, ev.threshold))}</td>'
            f'<td class="n ttoom">{escape(fmt.time_to_oom(f.ttoom))}</td>'
            f"<td>{state}</td><td>{escape(acts)}</td></tr>")
    return ('<table id="findings"><thead><tr><th class="n">first fired</th><th>severity</th>'
            "<th>signal</th><th>where</th><th class=n>value</th><th class=n>threshold</th>"
            "<th class=n>time to OOM</th><th>state</th><th>actions</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")
