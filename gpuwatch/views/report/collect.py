"""What the report keeps of a replay, tick by tick: memory envelopes per GPU and per judged
process, the leak detector's retained floor and fitted trend, engine series, and every event
and action. Read-only towards the pipeline: it plots what the analyzers themselves hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

import msgspec

from gpuwatch.events import ActionEvent, Event
from gpuwatch.signals.memory import MemoryAnalyzer
from gpuwatch.views.svg import Envelope

MAX_FLOOR_POINTS = 4000
MAX_GAPS = 200  # shaded on the charts; the count and the longest are kept beyond that
LATE_FACTOR = 2.0  # a tick this many intervals after the previous one came late
# Lines break only across gaps this long (the daemon was stopped, or not recording): ticks
# that slipped under load are late, not missing, and the line goes on across them.
BREAK_SECONDS, BREAK_INTERVALS = 60.0, 20


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
    judged_kind: str = ""  # probe | pool
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


def trigger_of(action: ActionEvent, signals: list[Event]) -> tuple:
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
    def __init__(self, t0: float, max_points: int = 500, interval: float = 2.0) -> None:
        self.t0 = t0
        self.t1 = t0
        self.ticks = 0
        self.interval = interval
        self.break_after = max(BREAK_SECONDS, BREAK_INTERVALS * interval)
        self.late = 0  # ticks that came LATE_FACTOR intervals or more after the previous
        self.stops = 0  # gaps longer than break_after
        self.longest_gap = 0.0
        self.longest_gap_at = t0
        self.gaps: list[tuple[float, float]] = []
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
        gap = t - self.t1
        if self.ticks and gap >= LATE_FACTOR * self.interval:
            if gap > self.break_after:
                self.stops += 1  # not recording: the lines break there
            else:
                self.late += 1
                if gap > self.longest_gap:
                    self.longest_gap, self.longest_gap_at = gap, self.t1
            if len(self.gaps) < MAX_GAPS:
                self.gaps.append((self.t1, t))
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
                self._follow(sv, pipeline, t, p.used_memory_bytes)
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
                self.action_where[id(ev)] = trigger_of(ev, signals)
            self.events.append(ev)
            if isinstance(ev, Event) and ev.signal == "memory_leak" and ev.gpu_uuid:
                self._leak_event(ev, pipeline)

    def _series_view(self, key, label) -> SeriesView:
        sv = self.series.get(key)
        if sv is None:
            sv = self.series[key] = SeriesView(key, label, self._env())
        return sv

    def _follow(self, sv: SeriesView, pipeline, t: float, nvml: float | None = None) -> None:
        """Pick up what the detector judged this tick where it is not NVML's figure (the
        probe's reserved bytes; an engine's planned pool, up to which memory is planned),
        and its retained floor each time it closes a bucket."""
        state = _leak_state(pipeline, *sv.key)
        series = getattr(state, "series", None)
        sv.last_t = t
        if series is None:
            return
        samples = getattr(getattr(series, "fast", None), "samples", None)
        if samples and samples[-1][0] == t:
            value, source = samples[-1][1], getattr(state, "source", "nvml")
            if sv.judged is None and (source == "probe" or (
                    nvml is not None and abs(value - nvml) >= 1)):
                sv.judged = self._env()
                sv.judged_kind = "probe" if source == "probe" else "pool"
            if sv.judged is not None:
                sv.judged.add(t, value)
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
