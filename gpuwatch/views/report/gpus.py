"""The GPUs and processes section: each GPU's memory against its threshold zones, then
one chart per leak-detector series (its memory, retained floor and fitted trend)."""

from __future__ import annotations

from html import escape

from gpuwatch.events import ActionEvent, Event
from gpuwatch.views import fmt
from gpuwatch.views.report.collect import Collector, GpuView, SeriesView
from gpuwatch.views.report.common import action_on, event_markers
from gpuwatch.views.svg import Line, chart

MAX_PROCESS_PLOTS = 12  # per GPU: those with findings first, then the largest
C_USED, C_JUDGED, C_FLOOR, C_TREND = "#8a94a3", "var(--accent)", "#e8590c", "#ae3ec9"


def _zone_bands(th: dict[str, float], top: float | None) -> list:
    warn, crit = th.get("warning"), th.get("critical")
    if warn is None or crit is None:
        return []
    top = max(top or 0, crit * 1.05)
    return [(0, warn, "safe", "safe zone"),
            (warn, crit, "warning", f"warning zone from {warn / fmt.MIB:.0f} MiB"),
            (crit, top, "critical", f"critical zone from {crit / fmt.MIB:.0f} MiB")]


def gpu_section(c: Collector, g: GpuView) -> str:
    top = g.total
    lines = [Line("used (NVML)", C_USED, g.used, band=False),
             Line("judged by the zone (used minus planned pools)", C_JUDGED, g.judged)]
    evs = [e for e in c.events if (isinstance(e, Event) and e.gpu_uuid == g.uuid) or
           (isinstance(e, ActionEvent) and action_on(c, e, g.uuid, None))]
    markers = event_markers(evs, lambda e: True, lambda e: None)
    y_hi = max(top or 0, *(g.thresholds.values() or [0]))
    unit = _mem_unit(y_hi)
    plot = chart(lines, c.t0, c.t1, _mem_axis(unit), bands=_zone_bands(g.thresholds, y_hi),
                 markers=markers, y_range=(0, y_hi or 1), title=f"GPU {g.index} memory",
                 y_unit=unit, gaps=c.gaps, breaks=c.break_after)
    th = g.thresholds
    size = _mem_axis(unit)
    figures = ", ".join(
        f'<span title="{escape(_mib(th.get(k)))} in the table">{k} '
        f"{size(th[k]) if th.get(k) is not None else fmt.DASH}</span>"
        for k in ("warning", "critical", "budget"))
    head = (f'<h3 id="gpu-{g.index}">GPU {g.index} · {escape(g.name or fmt.DASH)}</h3>'
            f'<p class="meta">{escape(g.uuid)} · total '
            f"{size(g.total) if g.total is not None else fmt.DASH} · "
            f"{escape(_row_text(g))}: {figures}</p>")
    procs = sorted((sv for k, sv in c.series.items() if k[0] == g.uuid),
                   key=lambda sv: (sv.key[1] is not None, not sv.trends, -sv.peak))
    return head + plot + "".join(_series_plot(c, sv) for sv in procs[:MAX_PROCESS_PLOTS]) + (
        f'<p class="muted">{len(procs) - MAX_PROCESS_PLOTS} more processes not plotted.</p>'
        if len(procs) > MAX_PROCESS_PLOTS else "")


def _series_plot(c: Collector, sv: SeriesView) -> str:
    uuid, pid = sv.key
    lines = [Line("memory (NVML)" if pid is not None else "memory no process accounts for",
                  C_JUDGED, sv.mem),
             *([Line("allocator reserved (probe): what the detector judges", "#2f9e44",
                     sv.judged)] if sv.judged is not None and sv.judged_kind == "probe" else
               [Line("what the detector judges: memory up to the engine's planned pool is "
                     "planned", "#0c8599", sv.judged)] if sv.judged is not None else []),
             Line("retained floor (leak detector)", C_FLOOR, points=sorted(sv.floor),
                  width=2.2)]
    vrules, trend_pts = [], []
    for tr in sv.trends:
        end = tr.t_to if tr.t_to is not None else max(sv.last_t, tr.t_detect)
        trend_pts += [(tr.t_from, tr.intercept + tr.rate * tr.t_from),
                      (end, tr.intercept + tr.rate * end)]
        if tr.onset is not None:
            vrules.append((tr.onset, "onset", f"onset ≈ {fmt.clock(tr.onset)}"))
        vrules.append((tr.t_detect, "detect", f"detected {fmt.rate(tr.rate)}"))
    if trend_pts:
        lines.append(Line("fitted trend", C_TREND, points=trend_pts[:2], dash="6 4", width=2))
    evs = [e for e in c.events if (isinstance(e, Event) and e.gpu_uuid == uuid and e.pid == pid
                                   and e.pid is not None) or
           (isinstance(e, ActionEvent) and pid is not None and action_on(c, e, uuid, pid))]
    markers = event_markers(evs, lambda e: True, lambda e: None)
    g = c.gpus.get(uuid)
    bounds = _union(sv.mem.bounds(), sv.judged.bounds() if sv.judged else None)
    bands = []
    # The GPU's zones, for scale; not where an engine's planned pool makes a process's own
    # memory incomparable with them (the zone judges the memory outside the pool).
    if g is not None and bounds and g.thresholds and pid is not None and not g.planned_max:
        bands = _zone_bands(g.thresholds, g.total)
    title = (f"pid {pid} ({c.names.get(pid, '?')})" if pid is not None else sv.label)
    unit = _mem_unit(bounds[1] - bounds[0] if bounds else 0)
    facts = " · ".join(f"leak detected {fmt.clock(tr.t_detect)} at {fmt.rate(tr.rate)}, "
                       f"time to OOM {fmt.time_to_oom(tr.ttoom)}" for tr in sv.trends)
    extra = "" if len(sv.trends) <= 1 else f" ({len(sv.trends)} episodes; the first is drawn)"
    return (f'<h3 class="series" data-pid="{pid if pid is not None else ""}">'
            f"{escape(title)} <span class=muted>on GPU {g.index if g else '?'}</span></h3>"
            f'<p class="meta">peak {fmt.size(sv.peak)}'
            f"{' · ' + escape(facts) + extra if facts else ' · no leak'}</p>"
            + chart(lines, c.t0, c.t1, _mem_axis(unit), bands=bands if _bands_visible(
                bands, bounds) else [], markers=markers, vrules=vrules, height=180,
                title=title, y_unit=unit, gaps=c.gaps, breaks=c.break_after))


def _row_text(g: GpuView) -> str:
    """The threshold row as a person reads it: a row named "derived" is the table's rule
    applied to this GPU's memory, not a row of its own."""
    if not g.row:
        return f"threshold row {fmt.DASH}"
    if g.row == "derived":
        return "thresholds derived from its memory"
    cal = {True: " (calibrated)", False: " (derived)"}.get(g.calibrated, "")
    return f"threshold row {g.row}{cal}"


def _mib(v) -> str:
    """Thresholds read in MiB, as the table writes them."""
    return fmt.signal_value("memory_zone", v)


def _union(a, b):
    if a is None or b is None:
        return a or b
    return min(a[0], b[0]), max(a[1], b[1])


def _mem_unit(span: float) -> float:
    return fmt.GIB if span >= 4 * fmt.GIB else fmt.MIB


def _mem_axis(unit: float):
    """Figures in one unit per chart (GiB or MiB), as the axis labels them."""
    name = "GiB" if unit == fmt.GIB else "MiB"
    return lambda v: f"{round(v / unit, 1):g} {name}"


def _bands_visible(bands, bounds) -> bool:
    """Zone bands only when the series comes near them (else they would flatten it)."""
    return bool(bands) and bounds is not None and bounds[1] >= 0.5 * bands[1][0]
