"""The Engines section: KV cache, queue latency quantiles and requests, per engine."""

from __future__ import annotations

from html import escape

from gpuwatch.events import Event
from gpuwatch.views import fmt
from gpuwatch.views.report.collect import Collector, EngineView
from gpuwatch.views.report.common import event_markers
from gpuwatch.views.svg import Line, chart


def engine_section(c: Collector, e: EngineView) -> str:
    s = e.series
    evs = [ev for ev in c.events if isinstance(ev, Event) and ev.engine == e.name]
    markers = event_markers(evs, lambda ev: True, lambda ev: None)
    out = [f'<h3 id="engine-{escape(e.name)}">engine {escape(e.name)} '
           f'<span class=muted>{escape(e.kind)} · {escape(e.model or fmt.DASH)}</span></h3>']
    if e.down:
        out.append('<p class="meta">down: ' + "; ".join(
            f"{fmt.clock(t)} {escape(r)}" for t, r in e.down[:5]) + "</p>")
    kv = [Line(label, color, s[k]) for k, label, color in (
        ("kv_usage", "KV cache usage", "var(--accent)"),
        ("kv_hit", "KV hit ratio (windowed)", "#2f9e44")) if k in s]
    if kv:
        out.append(chart(kv, c.t0, c.t1, lambda v: f"{v * 100:g} %", markers=markers,
                         y_range=(0, 1), height=170, title="KV cache", gaps=c.gaps,
                         breaks=c.break_after))
    qs = [Line(k.replace("queue_", "queue "), color, s[k]) for k, color in
          zip(sorted(k for k in s if k.startswith("queue_p")),
              ("#74c0fc", "#f59f00", "#e03131", "#ae3ec9"), strict=False)]
    if qs:
        out.append(chart(qs, c.t0, c.t1, lambda v: f"{v * 1000:.0f} ms", markers=markers,
                         height=170, title="queue latency", gaps=c.gaps,
                         breaks=c.break_after))
    rw = [Line(label, color, s[k]) for k, label, color in (
        ("running", "running", "var(--accent)"), ("waiting", "waiting", "#e8590c")) if k in s]
    if rw:
        out.append(chart(rw, c.t0, c.t1, lambda v: f"{v:g}", markers=markers, height=150,
                         title="requests", gaps=c.gaps, breaks=c.break_after))
    return "".join(out)
