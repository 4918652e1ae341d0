"""The All events section: every event and action in replay order, bounded."""

from __future__ import annotations

from html import escape

from gpuwatch.events import ActionEvent
from gpuwatch.views import fmt
from gpuwatch.views.report.collect import Collector
from gpuwatch.views.report.common import MAX_EVENT_ROWS, action_target, rel_time, where


def event_rows(c: Collector) -> str:
    rows = []
    for ev in c.events[:MAX_EVENT_ROWS]:
        if isinstance(ev, ActionEvent):
            rows.append(f'<tr class="action"><td class="n">{rel_time(ev.t, c.t0)}</td>'
                        f"<td>action</td><td><b>{escape(ev.action)}</b></td>"
                        f"<td>{escape(action_target(ev, c))}</td><td>{escape(ev.result)}</td>"
                        f"<td class=muted>{escape(ev.reason or ev.trigger)}</td></tr>")
        else:
            rows.append(f'<tr><td class="n">{rel_time(ev.t, c.t0)}</td>'
                        f'<td><span class="badge {escape(ev.severity)}">{escape(ev.state)}'
                        f"</span></td><td><b>{escape(ev.signal)}</b></td>"
                        f"<td>{escape(where(ev, c.gpus, c.names))}</td>"
                        f"<td>{escape(fmt.signal_value(ev.signal, ev.value))}</td>"
                        f"<td class=muted>{escape(ev.message)}</td></tr>")
    more = len(c.events) - MAX_EVENT_ROWS
    tail = f'<p class="muted">{more} more events not listed.</p>' if more > 0 else ""
    if not rows:
        return '<p class="muted">No events.</p>'
    return ("<table><thead><tr><th class=n>time</th><th>state</th><th>signal / action</th>"
            "<th>where / target</th><th>value / result</th><th>message</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{tail}")
