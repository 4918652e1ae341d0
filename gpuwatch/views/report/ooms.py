"""The OOMs section: every OOM a probe recorded (process_oom events), whether gpuwatch had
predicted it and how far ahead (the lead time of the first leak or time-to-OOM event), and
the process's memory up to it. Absent from a report of a recording without OOMs."""

from __future__ import annotations

from html import escape

from gpuwatch.events import Event
from gpuwatch.views import fmt
from gpuwatch.views.report.collect import Collector
from gpuwatch.views.report.common import rel_time, where
from gpuwatch.views.svg import Line, chart

MAX_OOM_PLOTS = 8
C_MEM, C_PROBE = "var(--accent)", "#2f9e44"
CAUSES = {"full": "GPU full", "fragmentation": "fragmentation", "limit": "process cap"}
OUTCOMES = {"raised": "raised", "caught": "caught by the program",
            "recovered": "recovered inside torch", "unknown": "not known"}


def ooms_of(c: Collector) -> list[Event]:
    return [e for e in c.events if isinstance(e, Event) and e.signal == "process_oom"]


def oom_section(c: Collector) -> str:
    ooms = ooms_of(c)
    if not ooms:
        return ""
    predicted = [e for e in ooms if e.oom is not None and e.oom.predicted_by]
    leads = [e.oom.lead_seconds for e in predicted if e.oom.lead_seconds is not None]
    lead = (f", the earliest {fmt.duration(max(leads))} and the latest "
            f"{fmt.duration(min(leads))} ahead" if len(leads) > 1 else
            f", {fmt.duration(leads[0])} ahead" if leads else "")
    head = (f"<h2>OOMs ({len(ooms)})</h2>"
            f'<p class="card">{len(ooms)} out-of-memory failure{"s" if len(ooms) != 1 else ""} '
            f"recorded by the processes' probes; gpuwatch had predicted {len(predicted)} of "
            f"them{lead}.</p>")
    rows = "".join(_row(c, e) for e in ooms)
    table = ("<table><thead><tr><th class=n>time</th><th>where</th><th class=n>request</th>"
             "<th class=n>free</th><th>cause</th><th>the program</th>"
             "<th class=n>fragmentation</th><th>predicted</th><th>record</th></tr></thead>"
             f"<tbody>{rows}</tbody></table>")
    plots = "".join(_plot(c, e) for e in ooms[:MAX_OOM_PLOTS])
    more = (f'<p class="muted">{len(ooms) - MAX_OOM_PLOTS} more OOMs not plotted.</p>'
            if len(ooms) > MAX_OOM_PLOTS else "")
    return head + table + plots + more


def _predicted(e: Event) -> str:
    o = e.oom
    if o is not None and o.predicted_by and o.lead_seconds is not None:
        return f"yes: {o.predicted_by}, {fmt.duration(o.lead_seconds)} before"
    if o is not None and o.warned_by:
        return f"no ({o.warned_by} before it)"
    return "no"


def _row(c: Collector, e: Event) -> str:
    o = e.oom
    free = fmt.size(e.threshold) + (f" of {fmt.size(o.total_bytes)}"
                                    if o is not None and o.total_bytes else "")
    cause = CAUSES.get(o.cause, o.cause) if o is not None else fmt.DASH
    program = OUTCOMES.get(o.outcome, o.outcome or fmt.DASH) if o is not None else fmt.DASH
    if o is not None and o.exited:
        program += ", process gone"
    frag = fmt.percent(o.fragmentation_ratio) if o is not None else fmt.DASH
    record = escape(o.record) if o is not None and o.record else fmt.DASH
    if o is not None and o.history:
        record += f'<br><span class=muted>history: {escape(o.history)}</span>'
    return (f'<tr class="oom" data-pid="{e.pid}"><td class="n">{rel_time(e.t, c.t0)}</td>'
            f"<td>{escape(where(e, c.gpus, c.names))}</td>"
            f'<td class="n">{fmt.size(e.value)}</td><td class="n">{free}</td>'
            f"<td>{escape(cause)}</td><td>{escape(program)}</td><td class=n>{frag}</td>"
            f"<td>{escape(_predicted(e))}</td><td>{record}</td></tr>")


def _upto(env, t_end: float) -> list[tuple[float, float]]:
    """An envelope's plotted values up to t_end (the chart does not clip in time)."""
    return [(t, last) for run in env.runs() for t, _, _, last in run if t <= t_end]


def _plot(c: Collector, e: Event) -> str:
    sv = c.series.get((e.gpu_uuid, e.pid))
    span = max(e.t - c.t0, 1.0)
    t_end = min(c.t1, e.t + 0.05 * span)
    mem = _upto(sv.mem, t_end) if sv is not None else []
    if not mem:
        return ""
    lines = [Line("memory (NVML)", C_MEM, points=mem)]
    probe = _upto(sv.judged, t_end) if sv.judged is not None else []
    if probe:
        lines.append(Line("allocator reserved (probe)", C_PROBE, points=probe))
    vrules = [(e.t, "detect", f"OOM: {fmt.size(e.value)} requested")]
    o = e.oom
    if o is not None and o.predicted_by and o.lead_seconds is not None:
        vrules.append((e.t - o.lead_seconds, "onset",
                       f"predicted by {o.predicted_by} ({fmt.duration(o.lead_seconds)} before)"))
    top = max(v for _, v in mem + probe)
    unit = fmt.GIB if top >= 4 * fmt.GIB else fmt.MIB
    name = "GiB" if unit == fmt.GIB else "MiB"
    title = f"pid {e.pid} ({c.names.get(e.pid, '?')}) up to its OOM"
    return (f'<h3 class="oom-plot" data-pid="{e.pid}">{escape(title)}</h3>'
            + chart(lines, c.t0, t_end, lambda v: f"{v / unit:g} {name}", vrules=vrules,
                    y_range=(0, top * 1.05), height=170, title=title, y_unit=unit))
