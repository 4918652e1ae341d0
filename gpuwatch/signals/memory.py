"""Memory analyzer: threshold row, zone, leak rate and time to OOM, per GPU and process.

Emits `memory_zone` (per GPU), `memory_leak` (per process, and per GPU for memory no
process accounts for — or for all of it when the driver gives no per-process figures) and
`time_to_oom` (per GPU: from the projection of the GPU's own retained memory,
signals/projection.py, and at no less than the rate of the leaks judged on it).
Pure: time comes from tick.t, state is bounded per series, output is deterministic.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from gpuwatch.events import Event
from gpuwatch.model import GpuSample, ProbeSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.config import SignalsConfig
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.leak import LOADING, STEADY, LeakParams, LeakSeries
from gpuwatch.signals.memory_events import SEVERITY, duration, leak_message, time_to_oom_event
from gpuwatch.signals.oom import HorizonState, headroom_bytes, time_to_oom
from gpuwatch.signals.pools import EnginePool, engine_pools, of_pid
from gpuwatch.signals.projection import UNATTRIBUTED, GpuProjection
from gpuwatch.signals.zone import ZONE_NAMES, ZoneState, planned_bytes
from gpuwatch.thresholds.table import Row, ThresholdTable, load_table

MIB = 1 << 20


@dataclass
class _Proc:
    series: LeakSeries
    create_time: float | None
    source: str  # nvml | probe
    last_seen: float
    last_fed: float = -math.inf
    # What the last judgement concluded (reused on ticks the series is not fed): the rate
    # it publishes (None: no estimate yet) and the rate a firing leak was judged on.
    rate: float | None = None
    judged: float | None = None
    # Escalated to critical by time to OOM in this episode: it stays critical until the
    # episode ends (the severity of one episode only goes up).
    escalated: bool = False


@dataclass
class _Gpu:
    signature: tuple
    series: LeakSeries
    last_seen: float
    zone: ZoneState = field(default_factory=ZoneState)
    horizon: HorizonState = field(default_factory=HorizonState)
    escalated: bool = False
    projection: GpuProjection | None = None
    last_value: float | None = None  # the GPU's own series' last sample


def _ttoom(headroom: float | None, rate: float | None) -> float | None:
    """Time to OOM, infinite when memory is not growing (None: no threshold row)."""
    if headroom is None:
        return None
    ttoom = time_to_oom(headroom, rate)
    return math.inf if ttoom is None else ttoom


def _pid(p) -> int:
    return p.pid


def _severity_level(ev: Event | None) -> int:
    return 0 if ev is None else 2 if ev.severity == "critical" else 1


def _may_load(series: LeakSeries, t: float) -> bool:
    """Whether the series' growth may still be its loading (not yet judged)."""
    return series.phase == LOADING and not series.life.judging(t)


class MemoryAnalyzer:
    def __init__(self, config=None, table: ThresholdTable | None = None) -> None:
        signals = getattr(config, "signals", config)
        self.cfg: SignalsConfig = signals if isinstance(signals, SignalsConfig) else SignalsConfig()
        self.table = table if table is not None else load_table()
        self.params = LeakParams.from_config(self.cfg.leak, self.table)
        lc = self.cfg.leak
        k = lc.sum_window_factor
        self.sum_params = LeakParams.from_config(msgspec.structs.replace(
            lc, scales_seconds=[k * s for s in lc.scales_seconds],
            exit_window_seconds=k * lc.exit_window_seconds), self.table)
        # thinned no further than the fast windows allow: a dozen samples in the critical
        # window, three a part in the early one (shortened windows take every tick)
        self._every = min(lc.sample_interval_seconds, lc.critical_window_seconds / 12,
                          lc.early_window_seconds / (3 * lc.early_parts))
        self._procs: dict[tuple[str, int], _Proc] = {}
        self._gpus: dict[str, _Gpu] = {}

    # -- per tick ---------------------------------------------------------------------------

    def update(self, tick: Tick, derived: Derived, conditions: Conditions) -> list[Event]:
        derived.threshold_table = dict(self.table.info)
        probes = self._probes(tick)
        # a probe's pid on one GPU only (which device is which GPU is not known here)
        gpus_of_pid = Counter(p.pid for gpu in tick.gpus for p in gpu.processes
                              if p.pid in probes) if probes else {}
        events: list[Event] = []
        single = {pid: probe for pid, probe in probes.items() if gpus_of_pid.get(pid) == 1}
        for gpu in tick.gpus:
            if gpu.lost:
                continue
            events += self._gpu(tick.t, gpu, derived, conditions, single)
        events += self._forget(tick, conditions)
        return events

    def _probes(self, tick: Tick) -> dict[int, ProbeSample]:
        """Fresh probe samples by pid; a pid whose probe reports several devices is left
        to NVML (which device is which GPU is not known here)."""
        lc = self.cfg.leak
        if not (lc.enabled and lc.prefer_probe):
            return {}
        out: dict[int, ProbeSample] = {}
        ambiguous: set[int] = set()
        for probe in tick.probes:
            if probe.reserved_bytes is None:
                continue
            if probe.t is not None and tick.t - probe.t > lc.probe_max_age_seconds:
                continue
            prev = out.get(probe.pid)
            if prev is not None and prev.device != probe.device:
                ambiguous.add(probe.pid)
            if prev is None or (probe.t or 0) >= (prev.t or 0):
                out[probe.pid] = probe
        for pid in ambiguous:
            del out[pid]
        return out

    def _gpu(self, t: float, gpu: GpuSample, derived: Derived, conditions: Conditions,
             probes: dict[int, ProbeSample]) -> list[Event]:
        uuid, used, total = gpu.uuid, gpu.memory_used_bytes, gpu.memory_total_bytes
        sig = derived.gpu(uuid)
        sig.notes = [n for n in sig.notes if not n.startswith(("zone:", "leak:"))]
        if used is None:
            return []
        row = self.table.match(gpu.name, total) if total else None
        events: list[Event] = []
        pools = self._pools(t, gpu, derived)
        # pools engines take (back) by design (loading, asleep) are not headroom
        ahead = sum(e.ahead for e in pools)
        headroom = headroom_bytes(row.budget_bytes, used + ahead) if row is not None else None

        # Leak series: per process (judged in the same pass: this runs for every process on
        # every tick), then the GPU as a whole.
        leak_on = self.cfg.leak.enabled
        horizon = self.cfg.time_to_oom
        crit_h = horizon.critical_seconds if horizon.enabled else None
        proc_rates: list[float] = []
        judged: list[float] = []  # the rates of the series judged leaking
        proc_events: list[Event] = []
        if leak_on:
            states, every = self._procs, self._every
            for p in sorted(gpu.processes, key=_pid):
                pid = p.pid
                state = states.get((uuid, pid))
                # the common case, kept short: the same process, on NVML, between samples of
                # the fast path (its retained memory still takes every sample)
                used_p = p.used_memory_bytes
                if (state is not None and pid not in probes and state.source == "nvml"
                        and p.create_time == state.create_time and used_p is not None
                        and t - state.last_fed + (t - state.last_seen) <= every):
                    state.last_seen, fed = t, False
                    pool = of_pid(pools, pid) if pools else None
                    if pool is None:
                        state.series.observe(t, float(used_p))
                    elif not pool.quiet:
                        state.series.observe(t, max(float(used_p), pool.floors.get(pid, 0.0)))
                else:
                    state, fed = self._proc_update(t, uuid, p, probes.get(pid), headroom,
                                                   of_pid(pools, pid))
                if state is not None and not fed:
                    # nothing it judges on moved: its signals and condition stand as they are
                    if state.rate is not None:
                        proc_rates.append(state.rate)
                    if state.judged is not None:
                        judged.append(state.judged)
                    continue
                psig = derived.process(uuid, pid)
                if state is None:
                    psig.leak_rate_bytes_per_second = psig.time_to_oom_seconds = None
                    psig.leak_severity = None
                    psig.phase = ""
                    continue
                series = state.series
                rate = state.rate = series.rate
                if rate is None:
                    rate = 0.0
                else:
                    proc_rates.append(rate)
                ttoom = _ttoom(headroom, rate)
                psig.leak_rate_bytes_per_second = rate
                psig.time_to_oom_seconds = ttoom
                psig.phase = series.phase
                ev = self._leak_event(t, uuid, pid, p.name, state, ttoom, crit_h, gpu.index,
                                      state.source)
                psig.leak_severity = _severity_level(ev)
                state.judged = None if ev is None else max(rate, series.value or 0.0)
                if state.judged is not None:
                    judged.append(state.judged)
                proc_events += conditions.set(t, ev, ("memory_leak", uuid, pid, None))
            gstate = self._gpu_update(t, gpu, used, headroom, pools)

        # Zone, on memory that was not planned.
        if row is not None:
            sig.thresholds = row.thresholds
            sig.threshold_row = row.id
            sig.threshold_calibrated = row.calibrated
        if row is not None and self.cfg.zone.enabled:
            events += self._zone(t, gpu, row, used, derived, conditions, pools)
        else:
            sig.zone = None
            sig.unplanned_memory_bytes = None

        if not leak_on:
            sig.leak_rate_bytes_per_second = sig.time_to_oom_seconds = None
            sig.leak_severity = sig.time_to_oom_severity = None
            return events

        # Rates and time to OOM: the GPU's rate is what its parts add up to. Every judged
        # series has a value on every tick (0 rate, infinite time to OOM when not growing):
        # an alert's `for:` restarts on any gap.
        own = gstate.series.rate if gstate.series.phase == STEADY else None
        g_rate = sum(proc_rates) + (own or 0.0)
        sig.leak_rate_bytes_per_second = g_rate
        events += proc_events

        # The GPU's own series: memory no process accounts for, or all of it when the
        # driver gives no per-process figures.
        source = "unattributed" if gstate.signature[0] else "nvml"
        ev = self._leak_event(t, uuid, None, "", gstate, _ttoom(headroom, own), crit_h,
                              gpu.index, source)
        sig.leak_severity = _severity_level(ev)
        if ev is not None:
            judged.append(max(own or 0.0, gstate.series.value or 0.0))
        events += conditions.set(t, ev, ("memory_leak", uuid, None, None))

        # Time to OOM: from the projection of the GPU's own retained memory, and at no less
        # than the rate the leaks judged on it were judged on (noise in the current estimate
        # then only shortens it: its verdict cannot fall back and fire again in one episode).
        # Shown only where memory rises: +Inf otherwise.
        proj = self._project(t, gpu, gstate, headroom)
        leaking = bool(judged) or proj is not None
        ttoom_rate = max(sum(judged), proj.rate if proj is not None else 0.0)
        g_ttoom = _ttoom(headroom, ttoom_rate if leaking else None)
        sig.time_to_oom_seconds = g_ttoom
        sig.headroom_bytes = headroom

        if horizon.enabled:
            level = gstate.horizon.update(t, g_ttoom, leaking, horizon)
            sig.time_to_oom_severity = level
            ev = None
            if level and g_ttoom is not None and headroom is not None:
                limit = horizon.critical_seconds if level == 2 else horizon.warning_seconds
                ev = time_to_oom_event(t, uuid, gpu.index, level, g_ttoom, headroom,
                                       ttoom_rate, limit, proj,
                                       {p.pid: p.name for p in gpu.processes})
            events += conditions.set(t, ev, ("time_to_oom", uuid, None, None))
        return events

    def _project(self, t: float, gpu: GpuSample, gstate: _Gpu, headroom: float | None):
        """The GPU's projection (signals/projection.py), fed each process's retained memory
        and the GPU's own series' once per block."""
        proj = gstate.projection
        if proj is None:
            # a sum of series: its floor wanders with the beat of its members' steps, so it
            # is judged on the sum's longer scales, like the GPU's own series without figures
            proj = gstate.projection = GpuProjection(self.sum_params.cfg, self.params.warn_on)
        if not proj.due(t):
            return proj.current
        members: dict[int, tuple[float | None, bool]] = {}
        own = gstate.series
        if gstate.signature and gstate.signature[0]:  # per-process figures: the processes
            for p in gpu.processes:
                state = self._procs.get((gpu.uuid, p.pid))
                if state is not None:
                    members[p.pid] = (state.series.floor.at(0), _may_load(state.series, t))
            members[UNATTRIBUTED] = (own.floor.at(0), False)
        else:  # all of used is the GPU's own series
            members[UNATTRIBUTED] = (own.floor.at(0), _may_load(own, t))
        return proj.update(t, members, headroom)

    def _pools(self, t: float, gpu: GpuSample, derived: Derived) -> list[EnginePool]:
        """The engines' planned pools and sleep states on this GPU (signals/pools.py)."""
        zc = self.cfg.zone
        if not zc.planned_pools:
            return []
        pools = engine_pools(gpu, derived.engines, zc.vllm_default_utilization, t,
                             self.cfg.leak.lifecycle.wake_settle_seconds)
        derived.gpu(gpu.uuid).notes.extend(
            f"leak: engine {e.engine} {e.quiet}: its memory is not judged" for e in pools
            if e.quiet)
        return pools

    # -- leak series ------------------------------------------------------------------------

    def _proc_update(self, t: float, uuid: str, p, probe: ProbeSample | None,
                     headroom: float | None,
                     pool: EnginePool | None = None) -> tuple[_Proc | None, bool]:
        """The process's state, and whether its series took this sample."""
        key = (uuid, p.pid)
        state = self._procs.get(key)
        if probe is not None and None not in (probe.create_time, p.create_time) and abs(
            probe.create_time - p.create_time  # type: ignore[operator]
        ) > 1.0:
            probe = None  # another process that once had this pid
        source, value = ("probe", probe.reserved_bytes) if probe else ("nvml", p.used_memory_bytes)
        restarted = (
            state is not None and p.create_time is not None and state.create_time is not None
            and p.create_time != state.create_time
        )
        if state is None or restarted:
            if value is None:
                return state, True
            started = p.create_time if p.create_time is not None else t
            state = _Proc(LeakSeries(self.params, min(started, t)), p.create_time, source, t)
            self._procs[key] = state
        elif state.create_time is None:
            # first seen without a start time (a /proc read that failed): the first one
            # known is its own, so a later restart under this pid is still told apart
            state.create_time = p.create_time
        tick = t - state.last_seen
        state.last_seen = t
        if value is None:
            return state, True
        if pool is not None and pool.quiet:
            return state, False  # an engine asleep or waking: its memory moves by design
        if source != state.source:
            state.source = source
            state.series.rebase()
            state.last_fed = -math.inf
        floor = pool.floors.get(p.pid, 0.0) if pool is not None else 0.0
        value = max(float(value), floor)  # up to its pool: planned
        # the fast path skips a sample only while the next tick still comes within the
        # interval: ticks at or over it are all taken, faster ones thinned to about one per
        # interval (the retained memory takes every sample)
        if t - state.last_fed + tick <= self._every:
            state.series.observe(t, value)
            return state, False
        state.last_fed = t
        state.series.update(t, value, headroom)
        return state, True

    def _gpu_update(self, t: float, gpu: GpuSample, used: int, headroom: float | None,
                    pools: Sequence[EnginePool] = ()) -> _Gpu:
        """The GPU's own series: used minus what its processes hold when NVML gives every
        process's figure (growth no process explains), else all of used."""
        held = [p.used_memory_bytes for p in gpu.processes]
        attributed = bool(held) and None not in held
        # below the processes' sum, the figures were read at different instants (or used is
        # capped at the total): no memory is unaccounted for, none is given back
        value = max(0, used - sum(held)) if attributed else used  # type: ignore[arg-type]
        signature = (attributed, *sorted((p.pid, p.create_time or 0.0) for p in gpu.processes))
        state = self._gpus.get(gpu.uuid)
        # Several processes that the driver gives no figure for: a sum of allocators.
        params = self.sum_params if not attributed and len(held) > 1 else self.params
        if (state is not None and state.signature != signature and not attributed
                and state.signature and not state.signature[0]
                and state.series.p is params and state.last_value is not None):
            # All of used, and processes came or went: the same sum goes on; what those
            # that left held is gone from its history, and those that came are loading.
            old, new = set(state.signature[1:]), set(signature[1:])
            gone = value - state.last_value if old - new else 0.0
            state.series.members_changed(t, min(gone, 0.0), bool(new - old))
            state.signature = signature
        elif state is None or state.signature != signature:
            # A process came, went or restarted: the GPU's baseline starts again, as old
            # as its youngest process (a daemon restart finds old processes steady).
            starts = [p.create_time for p in gpu.processes]
            started = t if state is not None or not starts or None in starts else max(starts)
            series = LeakSeries(params, min(started, t),  # type: ignore[type-var]
                                summed=params is self.sum_params)
            if state is None:
                state = self._gpus[gpu.uuid] = _Gpu(signature, series, t)
            else:
                state.signature, state.series = signature, series
                state.escalated = False
        state.last_seen = t
        state.last_value = float(value)
        if not attributed and pools:  # all of used: the engines' pools are in it
            if any(e.quiet for e in pools):
                return state  # an engine asleep or waking: hold
            value = max(value, sum(e.pool for e in pools))
        state.series.update(t, float(value), headroom)
        return state

    def _leak_event(self, t: float, uuid: str, pid: int | None, name: str,
                    state: _Proc | _Gpu, ttoom: float | None, crit_h: float | None,
                    index: int, source: str) -> Event | None:
        """The firing event of the series' verdict (None: no leak). It states the value
        the level was judged on and the entry level it reached; a warning whose time to
        OOM is under the critical horizon is critical for the rest of its episode."""
        series = state.series
        level = series.level
        if level == 0 or series.value is None or series.threshold is None:
            state.escalated = False
            return None
        if level == 1 and crit_h is not None and ttoom is not None and ttoom < crit_h:
            state.escalated = True
        severity = "critical" if level == 2 or state.escalated else "warning"
        slope = self.params.critical if level == 2 else self.params.warning
        who = f"pid {pid} ({name or '?'}) on GPU {index}" if pid is not None else f"GPU {index}"
        msg = leak_message(who, source, series, level, slope, self.cfg.leak.tolerance)
        if state.escalated and level == 1:
            msg += f"; time to OOM under the {duration(crit_h)} horizon: critical"  # type: ignore[arg-type]
        return Event(t=t, signal="memory_leak", state="firing", severity=severity,
                     gpu_uuid=uuid, pid=pid, value=series.value, threshold=series.threshold,
                     message=msg)

    # -- zone -------------------------------------------------------------------------------

    def _zone(self, t: float, gpu: GpuSample, row: Row, used: int, derived: Derived,
              conditions: Conditions, pools: list[EnginePool]) -> list[Event]:
        zc = self.cfg.zone
        sig = derived.gpu(gpu.uuid)
        planned, notes = (
            planned_bytes(gpu, derived.engines, zc.vllm_default_utilization, pools)
            if zc.planned_pools else (0.0, [])
        )
        unplanned = max(0.0, used - planned)
        state = self._gpus.get(gpu.uuid)
        if state is None:  # leak detection off: keep zone state anyway
            signature = ()
            state = self._gpus[gpu.uuid] = _Gpu(signature, LeakSeries(self.params, t), t)
        state.last_seen = t
        band = zc.hysteresis_ratio * row.memory_total_bytes
        level = state.zone.update(unplanned, row.warning_bytes, row.critical_bytes, band,
                                  zc.enter_samples, t, zc.hold_seconds)
        sig.zone = level
        sig.unplanned_memory_bytes = unplanned
        sig.notes.extend(notes)
        ev = None
        if level:
            limit = row.critical_bytes if level == 2 else row.warning_bytes
            kind = "calibrated" if row.calibrated else "derived"
            ev = Event(
                t=t, signal="memory_zone", state="firing", severity=SEVERITY[level],
                gpu_uuid=gpu.uuid, value=unplanned, threshold=float(limit),
                message=(f"GPU {gpu.index}: {unplanned / MIB:.0f} MiB of unplanned memory is in "
                         f"the {ZONE_NAMES[level]} zone (above {limit / MIB:.0f} MiB, "
                         f"{kind} row {row.id}, table {row.version})"),
            )
        return conditions.set(t, ev, ("memory_zone", gpu.uuid, None, None))

    # -- forgetting -------------------------------------------------------------------------

    def _forget(self, tick: Tick, conditions: Conditions) -> list[Event]:
        """Drop series not seen for a while; resolve what they had firing."""
        if not tick.gpus:
            return []  # no NVML sample at all: nothing to conclude
        t = tick.t
        limit = self.cfg.leak.lifecycle.forget_after_seconds
        present = {(g.uuid, p.pid) for g in tick.gpus for p in g.processes}
        events: list[Event] = []
        for key in sorted(k for k, s in self._procs.items()
                          if k not in present and t - s.last_seen > limit):
            del self._procs[key]
            events += conditions.set(t, None, ("memory_leak", key[0], key[1], None))
        uuids = {g.uuid for g in tick.gpus}
        for uuid in sorted(u for u, s in self._gpus.items()
                           if u not in uuids and t - s.last_seen > limit):
            del self._gpus[uuid]
            for signal in ("memory_leak", "memory_zone", "time_to_oom"):
                events += conditions.set(t, None, (signal, uuid, None, None))
        return events
