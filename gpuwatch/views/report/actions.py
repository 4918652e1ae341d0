"""The Actions section: what the remediation policy planned when replayed, and what the live
daemon took (its audit log, `--audit`)."""

from __future__ import annotations

from html import escape

import msgspec

from gpuwatch.events import ActionEvent
from gpuwatch.views.report.collect import Collector, trigger_of
from gpuwatch.views.report.common import (
    MAX_EVENT_ROWS,
    action_target,
    rel_time,
    taken_or_planned,
)


def actions_table(c: Collector, actions: list[ActionEvent]) -> str:
    if not actions:
        return '<p class="muted">No actions planned or taken.</p>'
    rows = "".join(
        f'<tr class="action {taken_or_planned(c, a)}"><td class="n">{rel_time(a.t, c.t0)}</td>'
        f"<td>{taken_or_planned(c, a)}</td><td><b>{escape(a.action)}</b></td>"
        f"<td>{escape(action_target(a, c))}</td><td>{escape(a.result)}</td>"
        f"<td class=muted>{escape(_why(a))}</td></tr>" for a in actions[:MAX_EVENT_ROWS])
    return ("<table id=actions><thead><tr><th class=n>time</th><th></th><th>action</th>"
            "<th>target</th><th>result</th><th>why</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _why(a: ActionEvent) -> str:
    d = a.detail or {}
    return " · ".join(str(x) for x in (d.get("signal"), d.get("severity"), a.reason) if x)


def add_audit(c: Collector, path: str, slack: float) -> int:
    """The actions the live daemon took while recording, from its audit log: final results
    only (not 'started'), within the recording's time span. Returns how many."""
    from gpuwatch.remediation.audit import read_records

    try:
        records = list(read_records(path))
    except OSError as exc:
        raise ValueError(f"--audit {path}: {exc.strerror or exc}") from None
    taken = []
    for rec in records:
        if not rec.get("action") or rec.get("result") in (None, "started"):
            continue
        try:
            ev = msgspec.convert({k: rec[k] for k in ("t", "action", "target", "result",
                                                      "reason", "trigger", "detail")
                                  if k in rec}, ActionEvent)
        except msgspec.ValidationError:
            continue  # a foreign or damaged record
        if c.t0 - slack <= ev.t <= c.t1 + slack:
            taken.append(ev)
            c.taken.add(id(ev))
            c.action_where[id(ev)] = trigger_of(ev, [])
    c.events = sorted(c.events + taken, key=lambda e: e.t)  # stable: replay order kept
    return len(taken)
