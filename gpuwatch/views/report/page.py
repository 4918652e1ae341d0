"""The whole page: header, how to read it, then one section after another."""

from __future__ import annotations

from html import escape

from gpuwatch import __version__
from gpuwatch.events import ActionEvent
from gpuwatch.views import fmt
from gpuwatch.views.report.actions import actions_table
from gpuwatch.views.report.collect import Collector
from gpuwatch.views.report.engines import engine_section
from gpuwatch.views.report.events import event_rows
from gpuwatch.views.report.findings import findings, summary
from gpuwatch.views.report.gpus import gpu_section
from gpuwatch.views.report.ooms import oom_section
from gpuwatch.views.report.style import CSS, EXPLAIN


def render(c: Collector, header, source: str, warning: str | None = None) -> str:
    found = findings(c)
    actions = [e for e in c.events if isinstance(e, ActionEvent)]
    table = c.table or {}
    span = f"{fmt.clock(c.t0, True)} &ndash; {fmt.clock(c.t1, True)} ({fmt.duration(c.t1 - c.t0)})"
    body = [
        f"<h1>gpuwatch report · {escape(header.host or 'unknown host')}</h1>",
        f'<p class="meta">{escape(source)} · {span} · {c.ticks} samples every '
        f"{header.interval_s:g} s · threshold table {escape(table.get('version', fmt.DASH))}"
        f" ({escape(table.get('source', ''))}) · gpuwatch {escape(__version__)}</p>",
        f'<p class="card warning">{escape(warning)}</p>' if warning else "",
        _late_note(c),
        EXPLAIN,
        "<h2>Findings</h2>", summary(c, found),
        oom_section(c),
        f"<h2>Actions ({len(actions)})</h2>",
        actions_table(c, actions),
        "<h2>GPUs and processes</h2>",
        *(gpu_section(c, g) for g in sorted(c.gpus.values(), key=lambda g: g.index)),
    ]
    if c.engines:
        body += ["<h2>Engines</h2>", *(engine_section(c, e) for e in c.engines.values())]
    body += ["<h2>All events</h2>", event_rows(c)]
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<meta name="color-scheme" content="light dark">'
            f"<title>gpuwatch report · {escape(header.host or '')}</title>"
            f"<style>{CSS}</style></head><body><main>{''.join(body)}</main></body></html>")


def _late_note(c: Collector) -> str:
    """Ticks that slipped (a loaded host): said, and shaded on every chart."""
    if not c.late and not c.stops:
        return ""
    late = (f"{c.late} of {c.ticks} samples came late (more than {c.interval * 2:g} s after "
            f"the one before; the longest gap {fmt.duration(c.longest_gap)} from "
            f"{fmt.clock(c.longest_gap_at)}): the host was busy. " if c.late else "")
    stops = (f"Sampling stopped {c.stops} time{'s' if c.stops > 1 else ''} for over "
             f"{fmt.duration(c.break_after)}: the lines break there. " if c.stops else "")
    return (f'<p class="card late">{late}{stops}The charts shade where no sample was taken'
            f"{' and draw the lines across late ticks' if c.late else ''}.</p>")
