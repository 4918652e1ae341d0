"""`gpuwatch report RECORDING -o FILE.html`: a self-contained HTML report of a recording.

It runs the replay pipeline (`replay_steps`: the same analyzers and policy as the live daemon
and `gpuwatch replay`) and, tick by tick, keeps what a person needs to see: memory per GPU
and per judged process against the threshold zones, the leak detector's retained floor and
fitted trend, events and planned actions, and the engines' KV cache and queue. Series are
decimated into bounded min/max envelopes, so any recording length renders in bounded memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from html import escape
from statistics import median

import msgspec

from gpuwatch import __version__
from gpuwatch.events import ActionEvent, Event
from gpuwatch.replay import replay_steps
from gpuwatch.signals.memory import MemoryAnalyzer
from gpuwatch.views import fmt
from gpuwatch.views.svg import Envelope, Line, Marker, chart

MAX_PROCESS_PLOTS = 12  # per GPU: those with findings first, then the largest
MAX_FLOOR_POINTS = 4000
MAX_EVENT_ROWS = 400
SEV_COLOR = {"warning": "var(--warn)", "critical": "var(--crit)"}
C_USED, C_JUDGED, C_FLOOR, C_TREND = "#8a94a3", "var(--accent)", "#e8590c", "#ae3ec9"


def _leak_state(pipeline, uuid: str, pid: int | None):
    """The memory analyzer's per-series state for a process or a GPU (its `series` is the
    leak detector, `source` what it judges), or None. Read-only: the report plots what the
    detector itself holds (its retained floor, its rate)."""
    for analyzer in pipeline.analyzers:
        if isinstance(analyzer, MemoryAnalyzer):
            states = getattr(analyzer, "_procs" if pid is not None else "_gpus", {})
            return states.get((uuid, pid) if pid is not None else uuid)
    return None


def _leak_series(pipeline, uuid: str, pid: int | None):
    return getattr(_leak_state(pipeline, uuid, pid), "series", None)


@dataclass
class Trend:
    """The detector's fitted trend at detection: v = intercept + rate * t."""

    t_detect: float
    rate: float
    intercept: float
    t_from: float
    t_to: float | None = None  # resolved at; None: to the end of the series
    onset: float | None = None
    ttoom: float | None = None


@dataclass
class SeriesView:
    """One leak-detector series: a process's memory, or a GPU's unattributed memory."""

    key: tuple[str, int | None]
    label: str
    mem: Envelope
    floor: list[tuple[float, float]] = field(default_factory=list)
    # what the detector judges when it is not NVML's figure (the probe's reserved bytes)
    judged: Envelope | None = None
    trends: list[Trend] = field(default_factory=list)
    last_t: float = 0.0
    peak: float = 0.0


@dataclass
class GpuView:
    uuid: str
    index: int
    name: str
    total: float | None
    used: Envelope
    judged: Envelope
    thresholds: dict[str, float] = field(default_factory=dict)
    row: str = ""
    calibrated: bool | None = None
    planned_max: float = 0.0  # an engine's pre-allocated pool, at its largest


@dataclass
class EngineView:
    name: str
    kind: str = ""
    model: str = ""
    series: dict[str, Envelope] = field(default_factory=dict)
    down: list[tuple[float, str]] = field(default_factory=list)


def _trigger_of(action: ActionEvent, signals: list[Event]) -> tuple:
    """(signal, gpu_uuid, pid, engine) of the firing event an action answers: the detail
    names it when it can; else the same tick's firing event of that signal and severity."""
    d = action.detail or {}
    if d.get("gpu_uuid") or d.get("pid") is not None or d.get("engine"):
        return (d.get("signal"), d.get("gpu_uuid"), d.get("pid"), d.get("engine"))
    for ev in signals:
        if ev.state == "firing" and ev.signal == d.get("signal") and (
                ev.severity == d.get("severity", ev.severity)):
            return ev.key
    return (d.get("signal"), None, None, None)


class Collector:
    def __init__(self, t0: float, max_points: int = 500) -> None:
        self.t0 = t0
        self.t1 = t0
        self.ticks = 0
        self.max_points = max_points
        self.gpus: dict[str, GpuView] = {}
        self.series: dict[tuple[str, int | None], SeriesView] = {}
        self.engines: dict[str, EngineView] = {}
        self.events: list[Event | ActionEvent] = []
        self.names: dict[int, str] = {}
        self.table: dict[str, str] = {}
        # action (by id) -> key of the signal event that triggered it
        self.action_where: dict[int, tuple] = {}
        self.taken: set[int] = set()  # actions the live daemon took (its audit log)

    def _env(self) -> Envelope:
        return Envelope(self.t0, self.max_points)

    def step(self, tick, pipeline, events) -> None:
        t = tick.t
        self.t1, self.ticks = t, self.ticks + 1
        derived = pipeline.derived
        self.table = derived.threshold_table or self.table
        for g in tick.gpus:
            view = self.gpus.get(g.uuid)
            if view is None:
                view = self.gpus[g.uuid] = GpuView(g.uuid, g.index, g.name,
                                                   g.memory_total_bytes, self._env(), self._env())
            sig = derived.gpus.get(g.uuid)
            if g.memory_used_bytes is not None:
                view.used.add(t, g.memory_used_bytes)
                judged = getattr(sig, "unplanned_memory_bytes", None)
                view.judged.add(t, judged if judged is not None else g.memory_used_bytes)
                if judged is not None:
                    view.planned_max = max(view.planned_max, g.memory_used_bytes - judged)
            if sig is not None and sig.thresholds:
                view.thresholds = dict(sig.thresholds)
                view.row, view.calibrated = sig.threshold_row, sig.threshold_calibrated
            for p in g.processes:
                if p.name:
                    self.names[p.pid] = p.name
                if p.used_memory_bytes is None or (g.uuid, p.pid) not in derived.processes:
                    continue
                sv = self._series_view((g.uuid, p.pid), f"pid {p.pid} ({p.name or '?'})")
                sv.mem.add(t, p.used_memory_bytes)
                sv.peak = max(sv.peak, p.used_memory_bytes)
                self._follow(sv, pipeline, t)
            gsv = self.series.get((g.uuid, None))
            if gsv is not None:
                self._follow_gpu(gsv, pipeline, t)
        for name, e in derived.engines.items():
            self._engine(name, e, t)
        signals = [ev for ev in events if isinstance(ev, Event)]
        for ev in events:
            # a copy: an active condition's event is refreshed in place after publication
            ev = msgspec.structs.replace(ev)
            if isinstance(ev, ActionEvent):
                self.action_where[id(ev)] = _trigger_of(ev, signals)
            self.events.append(ev)
            if isinstance(ev, Event) and ev.signal == "memory_leak" and ev.gpu_uuid:
                self._leak_event(ev, pipeline)

    def _series_view(self, key, label) -> SeriesView:
        sv = self.series.get(key)
        if sv is None:
            sv = self.series[key] = SeriesView(key, label, self._env())
        return sv

    def _follow(self, sv: SeriesView, pipeline, t: float) -> None:
        """Pick up the detector's retained floor each time it closes a bucket."""
        state = _leak_state(pipeline, *sv.key)
        series = getattr(state, "series", None)
        sv.last_t = t
        if series is None:
            return
        samples = getattr(getattr(series, "fast", None), "samples", None)
        if getattr(state, "source", "nvml") == "probe" and samples and samples[-1][0] == t:
            if sv.judged is None:
                sv.judged = self._env()
            sv.judged.add(t, samples[-1][1])
        trend = getattr(series, "trend", None)
        pts = getattr(trend, "points", None)
        if pts is None:
            return
        if len(pts) and (not sv.floor or pts[-1][0] > sv.floor[-1][0]):
            sv.floor.append(pts[-1])
            if len(sv.floor) > MAX_FLOOR_POINTS:  # one per bucket: thin out, stay bounded
                sv.floor = sv.floor[::2]

    def _follow_gpu(self, sv: SeriesView, pipeline, t: float) -> None:
        series = _leak_series(pipeline, sv.key[0], None)
        samples = getattr(getattr(series, "fast", None), "samples", None)
        if samples and samples[-1][0] == t:  # the value the detector judged this tick
            sv.mem.add(t, samples[-1][1])
            sv.peak = max(sv.peak, samples[-1][1])
        self._follow(sv, pipeline, t)

    def _leak_event(self, ev: Event, pipeline) -> None:
        key = (ev.gpu_uuid, ev.pid)
        if ev.pid is None and key not in self.series:
            # a GPU-level leak: its series is plotted from now on
            view = self.gpus.get(ev.gpu_uuid)
            label = f"GPU {view.index if view else '?'} memory no process accounts for"
            self._follow_gpu(self._series_view(key, label), pipeline, ev.t)
        sv = self.series.get(key)
        if sv is None:
            return
        if ev.state == "resolved":
            if sv.trends and sv.trends[-1].t_to is None:
                sv.trends[-1].t_to = ev.t
            return
        if sv.trends and sv.trends[-1].t_to is None:
            return  # an escalation of the same episode
        series = _leak_series(pipeline, *key)
        rate = getattr(series, "rate", None) or ev.value
        if not rate:
            return
        trend_pts = list(getattr(getattr(series, "trend", None), "points", ()))
        pts = trend_pts if len(trend_pts) >= 3 else list(
            getattr(getattr(series, "fast", None), "samples", ()))
        if not pts:
            return
        intercept = median(v - rate * t for t, v in pts)
        tr = Trend(ev.t, rate, intercept, pts[0][0])
        # Onset: where the fitted line leaves the lowest level held before detection.
        held = [v for t, v in sv.floor if t <= ev.t] or [v for _, v in pts]
        base = min(held)
        # The floor is the minimum of the last floor window: it starts rising that much
        # after the memory does.
        lag = 0.0
        if pts is trend_pts:
            trend = series.trend
            lag = getattr(trend, "floor_n", 0) * getattr(trend, "bucket_s", 0.0)
        if rate > 0:
            tr.onset = max(self.t0, min(ev.t, (base - intercept) / rate - lag))
            tr.t_from = min(tr.t_from, tr.onset)
        proc = pipeline.derived.processes.get(key) if ev.pid is not None else \
            pipeline.derived.gpus.get(ev.gpu_uuid)
        tr.ttoom = getattr(proc, "time_to_oom_seconds", None)
        sv.trends.append(tr)

    def _engine(self, name: str, e, t: float) -> None:
        view = self.engines.get(name)
        if view is None:
            view = self.engines[name] = EngineView(name)
        view.kind = getattr(e, "kind", "") or view.kind
        view.model = getattr(e, "model", "") or view.model
        values = {
            "kv_usage": getattr(e, "kv_cache_usage_ratio", None),
            "kv_hit": getattr(e, "kv_cache_hit_ratio", None),
            "running": getattr(e, "requests_running", None),
            "waiting": getattr(e, "requests_waiting", None),
        }
        for q, v in (getattr(e, "queue_latency_seconds", None) or {}).items():
            values[f"queue_p{float(q) * 100:g}"] = v
        for k, v in values.items():
            if v is not None:
                view.series.setdefault(k, self._env()).add(t, float(v))
        if getattr(e, "up", True) is False:
            reason = getattr(e, "reason", "")
            if not view.down or view.down[-1][1] != reason:
                view.down.append((t, reason))


# -- findings -------------------------------------------------------------------------------

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


# -- HTML -----------------------------------------------------------------------------------

CSS = """
:root { --bg:#f6f7f9; --card:#fff; --fg:#1d2430; --muted:#5f6b7a; --line:#dde1e7;
  --safe:#2f9e44; --warn:#e8a200; --crit:#e03131; --accent:#3b6fd4; }
@media (prefers-color-scheme: dark) { :root { --bg:#0f1216; --card:#171b21; --fg:#e3e7ec;
  --muted:#8e99a6; --line:#2a3039; --safe:#40c057; --warn:#f2b01e; --crit:#ff5c5c;
  --accent:#6d9cff; } }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif; }
main { max-width:1140px; margin:0 auto; padding:18px 20px 40px; }
h1 { font-size:22px; margin:0 0 4px; } h2 { font-size:17px; margin:28px 0 8px; }
h3 { font-size:15px; margin:18px 0 4px; }
.meta, .muted, figcaption { color:var(--muted); }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:12px 14px; margin:8px 0; }
table { width:100%; border-collapse:collapse; font-size:13px; font-variant-numeric:tabular-nums; }
th { text-align:left; color:var(--muted); font-weight:600; font-size:12px;
  border-bottom:1px solid var(--line); padding:4px 6px; }
td { padding:4px 6px; border-bottom:1px solid var(--line); vertical-align:top; }
td.n, th.n { text-align:right; white-space:nowrap; }
.badge { display:inline-block; padding:0 7px; border-radius:9px; font-size:12px; font-weight:600;
  color:#fff; background:var(--warn); }
.badge.critical { background:var(--crit); } .badge.warning { color:#1d1d1d; }
.badge.resolved { background:var(--safe); } .badge.ongoing { background:var(--muted); }
figure.plot { margin:6px 0 14px; }
svg.chart { width:100%; height:auto; display:block; }
svg .grid { stroke:var(--line); stroke-width:1; }
svg .frame { fill:none; stroke:var(--line); }
svg text { fill:var(--muted); font-size:11px; font-family:inherit; }
svg .ylab { text-anchor:end; } svg .xlab { text-anchor:middle; }
svg .band.safe { fill:var(--safe); opacity:.08; }
svg .band.warning { fill:var(--warn); opacity:.16; }
svg .band.critical { fill:var(--crit); opacity:.16; }
svg .env { opacity:.18; stroke:none; }
svg .vrule { stroke-width:1.5; stroke-dasharray:4 3; }
svg .vrule.onset { stroke:#ae3ec9; } svg .vrule.detect { stroke:var(--crit); }
svg .vlab.onset { fill:#ae3ec9; } svg .vlab.detect { fill:var(--crit); }
figcaption span { margin-right:14px; font-size:12px; }
figcaption i { display:inline-block; width:12px; height:3px; margin-right:5px;
  vertical-align:middle; }
.explain { font-size:13px; color:var(--muted); }
"""


def _where(ev, gpus: dict[str, GpuView], names: dict[int, str]) -> str:
    return _place(getattr(ev, "gpu_uuid", None), getattr(ev, "pid", None),
                  getattr(ev, "engine", None), gpus, names)


def _place(uuid, pid, engine, gpus: dict[str, GpuView], names: dict[int, str]) -> str:
    labels = {u: f"GPU {g.index} {g.name}" for u, g in gpus.items()}
    return fmt.place(uuid, pid, engine, labels, names)


def _rel(t: float, t0: float) -> str:
    return f"{fmt.clock(t)} <span class=muted>(+{fmt.duration(t - t0)})</span>"


def _summary(c: Collector, found: list[Finding]) -> str:
    if not found:
        return '<p class="card">No findings: nothing crossed a threshold in this recording.</p>'
    rows = []
    for f in found:
        ev = f.first
        state = (f'<span class="badge resolved">resolved {fmt.clock(f.resolved)}</span>'
                 if f.resolved else '<span class="badge ongoing">ongoing at end</span>')
        acts = ", ".join(f"{a.action}: {a.result} ({_kind(c, a)})" for a in f.actions) or fmt.DASH
        rows.append(
            f'<tr class="finding" data-signal="{escape(ev.signal)}">'
            f'<td class="n">{_rel(ev.t, c.t0)}</td>'
            f'<td><span class="badge {escape(f.severity)}">{escape(f.severity)}</span></td>'
            f"<td><b>{escape(ev.signal)}</b></td><td>{escape(_where(ev, c.gpus, c.names))}</td>"
            f'<td class="n value">{escape(fmt.signal_value(ev.signal, ev.value))}</td>'
            f'<td class="n">{escape(fmt.signal_value(ev.signal, ev.threshold))}</td>'
            f'<td class="n ttoom">{escape(fmt.time_to_oom(f.ttoom))}</td>'
            f"<td>{state}</td><td>{escape(acts)}</td></tr>")
    return ('<table id="findings"><thead><tr><th class="n">first fired</th><th>severity</th>'
            "<th>signal</th><th>where</th><th class=n>value</th><th class=n>threshold</th>"
            "<th class=n>time to OOM</th><th>state</th><th>actions</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _zone_bands(th: dict[str, float], top: float | None) -> list:
    warn, crit = th.get("warning"), th.get("critical")
    if warn is None or crit is None:
        return []
    top = max(top or 0, crit * 1.05)
    return [(0, warn, "safe", "safe zone"),
            (warn, crit, "warning", f"warning zone from {warn / fmt.MIB:.0f} MiB"),
            (crit, top, "critical", f"critical zone from {crit / fmt.MIB:.0f} MiB")]


def _markers(events, match, y_of) -> list[Marker]:
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


def _action_on(c: Collector, ev: ActionEvent, uuid: str, pid: int | None) -> bool:
    _, g, p, _ = c.action_where.get(id(ev), (None,) * 4)
    return g == uuid and (pid is None or p == pid)


def _gpu_section(c: Collector, g: GpuView) -> str:
    top = g.total
    lines = [Line("used (NVML)", C_USED, g.used, band=False),
             Line("judged by the zone (used minus planned pools)", C_JUDGED, g.judged)]
    evs = [e for e in c.events if (isinstance(e, Event) and e.gpu_uuid == g.uuid) or
           (isinstance(e, ActionEvent) and _action_on(c, e, g.uuid, None))]
    markers = _markers(evs, lambda e: True, lambda e: None)
    y_hi = max(top or 0, *(g.thresholds.values() or [0]))
    unit = _mem_unit(y_hi)
    plot = chart(lines, c.t0, c.t1, _mem_axis(unit), bands=_zone_bands(g.thresholds, y_hi),
                 markers=markers, y_range=(0, y_hi or 1), title=f"GPU {g.index} memory",
                 y_unit=unit)
    cal = {True: "calibrated", False: "derived"}.get(g.calibrated, fmt.DASH)
    th = g.thresholds
    head = (f'<h3 id="gpu-{g.index}">GPU {g.index} · {escape(g.name or fmt.DASH)}</h3>'
            f'<p class="meta">{escape(g.uuid)} · total {fmt.size(g.total)} · threshold row '
            f"{escape(g.row or fmt.DASH)} ({cal}): warning {_mib(th.get('warning'))}, "
            f"critical {_mib(th.get('critical'))}, budget {_mib(th.get('budget'))}</p>")
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
                     sv.judged)] if sv.judged is not None else []),
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
           (isinstance(e, ActionEvent) and pid is not None and _action_on(c, e, uuid, pid))]
    markers = _markers(evs, lambda e: True, lambda e: None)
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
                title=title, y_unit=unit))


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
    """Axis labels in one unit per chart (GiB or MiB)."""
    name = "GiB" if unit == fmt.GIB else "MiB"
    return lambda v: f"{v / unit:g} {name}"


def _bands_visible(bands, bounds) -> bool:
    """Zone bands only when the series comes near them (else they would flatten it)."""
    return bool(bands) and bounds is not None and bounds[1] >= 0.5 * bands[1][0]


def _engine_section(c: Collector, e: EngineView) -> str:
    s = e.series
    evs = [ev for ev in c.events if isinstance(ev, Event) and ev.engine == e.name]
    markers = _markers(evs, lambda ev: True, lambda ev: None)
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
                         y_range=(0, 1), height=170, title="KV cache"))
    qs = [Line(k.replace("queue_", "queue "), color, s[k]) for k, color in
          zip(sorted(k for k in s if k.startswith("queue_p")),
              ("#74c0fc", "#f59f00", "#e03131", "#ae3ec9"), strict=False)]
    if qs:
        out.append(chart(qs, c.t0, c.t1, lambda v: f"{v * 1000:.0f} ms", markers=markers,
                         height=170, title="queue latency"))
    rw = [Line(label, color, s[k]) for k, label, color in (
        ("running", "running", "var(--accent)"), ("waiting", "waiting", "#e8590c")) if k in s]
    if rw:
        out.append(chart(rw, c.t0, c.t1, lambda v: f"{v:g}", markers=markers, height=150,
                         title="requests"))
    return "".join(out)


def _event_rows(c: Collector) -> str:
    rows = []
    for ev in c.events[:MAX_EVENT_ROWS]:
        if isinstance(ev, ActionEvent):
            rows.append(f'<tr class="action"><td class="n">{_rel(ev.t, c.t0)}</td>'
                        f"<td>action</td><td><b>{escape(ev.action)}</b></td>"
                        f"<td>{escape(_action_target(ev, c))}</td><td>{escape(ev.result)}</td>"
                        f"<td class=muted>{escape(ev.reason or ev.trigger)}</td></tr>")
        else:
            rows.append(f'<tr><td class="n">{_rel(ev.t, c.t0)}</td>'
                        f'<td><span class="badge {escape(ev.severity)}">{escape(ev.state)}'
                        f"</span></td><td><b>{escape(ev.signal)}</b></td>"
                        f"<td>{escape(_where(ev, c.gpus, c.names))}</td>"
                        f"<td>{escape(fmt.signal_value(ev.signal, ev.value))}</td>"
                        f"<td class=muted>{escape(ev.message)}</td></tr>")
    more = len(c.events) - MAX_EVENT_ROWS
    tail = f'<p class="muted">{more} more events not listed.</p>' if more > 0 else ""
    if not rows:
        return '<p class="muted">No events.</p>'
    return ("<table><thead><tr><th class=n>time</th><th>state</th><th>signal / action</th>"
            "<th>where / target</th><th>value / result</th><th>message</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>{tail}")


EXPLAIN = """<p class="explain">How to read this: each GPU chart shows its memory over time
against the threshold table's zones (green safe, amber warning, red critical; MiB = 2<sup>20</sup>
bytes). For a GPU running an inference engine that pre-allocates its KV cache, the zones judge
the memory outside that planned pool. Each process chart shows its memory (the shaded band is
the min&ndash;max within each plotted interval), the <b style="color:#e8590c">retained floor</b> the
leak detector tracks (memory the process keeps; allocator sawtooth and bursts do not lift it),
and, once a leak is detected, the <b style="color:#ae3ec9">fitted trend</b> with its estimated
onset and the detection time. Triangles are events firing (amber warning, red critical),
circles resolved, diamonds actions. "Planned" actions are what the remediation policy plans
for each event when replayed (on the live host guardrails decide whether they run); "taken"
ones come from the daemon's audit log (<code>--audit</code>).</p>"""


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
        EXPLAIN,
        "<h2>Findings</h2>", _summary(c, found),
        f"<h2>Actions ({len(actions)})</h2>",
        _actions_table(c, actions),
        "<h2>GPUs and processes</h2>",
        *(_gpu_section(c, g) for g in sorted(c.gpus.values(), key=lambda g: g.index)),
    ]
    if c.engines:
        body += ["<h2>Engines</h2>", *(_engine_section(c, e) for e in c.engines.values())]
    body += ["<h2>All events</h2>", _event_rows(c)]
    return ("<!doctype html><html lang=en><head><meta charset=utf-8>"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<meta name="color-scheme" content="light dark">'
            f"<title>gpuwatch report · {escape(header.host or '')}</title>"
            f"<style>{CSS}</style></head><body><main>{''.join(body)}</main></body></html>")


def _kind(c: Collector, a: ActionEvent) -> str:
    return "taken" if id(a) in c.taken else "planned"


def _actions_table(c: Collector, actions: list[ActionEvent]) -> str:
    if not actions:
        return '<p class="muted">No actions planned or taken.</p>'
    rows = "".join(
        f'<tr class="action {_kind(c, a)}"><td class="n">{_rel(a.t, c.t0)}</td>'
        f"<td>{_kind(c, a)}</td><td><b>{escape(a.action)}</b></td>"
        f"<td>{escape(_action_target(a, c))}</td><td>{escape(a.result)}</td>"
        f"<td class=muted>{escape(_why(a))}</td></tr>" for a in actions[:MAX_EVENT_ROWS])
    return ("<table id=actions><thead><tr><th class=n>time</th><th></th><th>action</th>"
            "<th>target</th><th>result</th><th>why</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _why(a: ActionEvent) -> str:
    d = a.detail or {}
    return " · ".join(str(x) for x in (d.get("signal"), d.get("severity"), a.reason) if x)


def _action_target(a: ActionEvent, c: Collector) -> str:
    _, uuid, pid, engine = c.action_where.get(id(a), (None,) * 4)
    if uuid or pid is not None or engine:
        return _place(uuid, pid, engine, c.gpus, c.names)
    return a.target


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
            c.action_where[id(ev)] = _trigger_of(ev, [])
    c.events = sorted(c.events + taken, key=lambda e: e.t)  # stable: replay order kept
    return len(taken)


def build(recording: str, cfg, *, actions: bool = True, max_points: int = 500,
          audit: str | None = None) -> str:
    """The report's HTML for a recording (raises ValueError for a bad recording)."""
    from gpuwatch.recording import ReadReport
    from gpuwatch.replay import truncation_warning

    read = ReadReport()
    header, steps = replay_steps(recording, cfg, actions, read)
    collector: Collector | None = None
    for tick, pipeline, events in steps:
        if collector is None:
            collector = Collector(tick.t, max_points)
        collector.step(tick, pipeline, events)
    if collector is None:
        raise ValueError(f"{recording}: the recording has no samples")
    if audit:
        add_audit(collector, audit, header.interval_s)
    warning = truncation_warning(os.path.basename(recording), read)
    return render(collector, header, os.path.basename(recording), warning)
