"""Leak detection: estimator pieces, life cycle, the analyzer on synthetic traces, metrics."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from benchmarks import leak_detection as bench
from gpuwatch.config import Config, load
from gpuwatch.exporter.families import memory_signals
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, ProbeSample, ProcessSample, Tick
from gpuwatch.signals.config import LeakConfig, LifecycleConfig
from gpuwatch.signals.leak import (
    LOADING,
    STEADY,
    WARMUP,
    FastWindow,
    LeakParams,
    LeakSeries,
    RetainedFloor,
    RollingMin,
    theil_sen,
)
from gpuwatch.signals.leak.series import scales_of as leak_scales
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.thresholds import load_table

MIB = 1 << 20
GIB = 1 << 30
TRACES = Path(__file__).parent / "fixtures" / "traces"
T0 = 1_767_225_600.0
WARN = 12 * MIB / 60
CRIT = 50 * MIB
A100 = ("NVIDIA A100-SXM4-80GB", 80 * GIB)


def series(cfg: LeakConfig | None = None, started: float = T0 - 86400) -> LeakSeries:
    cfg = cfg or LeakConfig()
    return LeakSeries(LeakParams.from_config(cfg, load_table()), started)


def feed(s: LeakSeries, fn, seconds: float, dt: float = 3.0, start: float = 0.0):
    """Feed fn(elapsed) every dt; return the elapsed times at which the level changed."""
    changes = []
    level = s.level
    n = int(seconds / dt)
    for i in range(n):
        el = start + i * dt
        s.update(T0 + el, fn(el))
        if s.level != level:
            changes.append((el, s.level))
            level = s.level
    return changes


def saw(el: float, amp=600 * MIB, period=90.0) -> float:
    return amp * ((el % period) / period)


# -- pieces -----------------------------------------------------------------------------------


def test_theil_sen_ignores_a_minority_of_outliers():
    pts = [(float(i), 2.0 * i) for i in range(20)]
    pts[5] = (5.0, 1e9)
    pts[12] = (12.0, -1e9)
    assert theil_sen(pts) == pytest.approx(2.0)
    assert theil_sen([(1.0, 1.0)]) is None


def test_rolling_min():
    r = RollingMin(10.0)
    assert [r.add(t, v) for t, v in [(0, 5), (3, 7), (6, 4), (9, 8), (17, 9), (18, 6)]] == [
        5, 5, 4, 4, 8, 6]


def floor_of(fn, seconds: float, dt: float = 3.0) -> RetainedFloor:
    cfg = LeakConfig()
    f = RetainedFloor(cfg.block_seconds, cfg.block_seconds, cfg.max_floor_window_seconds,
                      cfg.return_memory_seconds, 2 * max(cfg.scales_seconds),
                      cfg.floor_tolerance_bytes)
    for i in range(int(seconds / dt)):
        f.add(i * dt, fn(i * dt))
    return f


def test_retained_floor_follows_the_floor_not_the_peaks():
    # a 2 GiB sawtooth of 120 s over a leak: the floor window learns the period, and the
    # retained memory climbs at the leak's pace, not the sawtooth's
    f = floor_of(lambda el: 20 * GIB + saw(el, 2 * GIB, 120) + WARN * el, 3600)
    assert 90 <= f.period <= 180  # to the block
    pts = list(f.points)[20:]  # once the period is known
    per_block = [b - a for a, b in itertools.pairwise(pts)]
    assert max(per_block) < 2 * GIB / 8  # never a ramp of the sawtooth
    rate = (pts[-1] - pts[-41]) / (40 * f.block_s)
    assert rate == pytest.approx(WARN, rel=0.25)


def test_a_series_that_never_comes_back_down_needs_no_floor_window():
    # churn given back within seconds, and a leak on a flat floor: one block
    def churn(el):
        return 20 * GIB + (GIB if int(el) % 6 < 3 else 0) + 5 * MIB * el
    f = floor_of(churn, 1800, dt=1.0)
    assert f.period == f.block_s
    assert (f.at(0) - f.at(4)) / (4 * f.block_s) == pytest.approx(5 * MIB, rel=0.1)


def test_fast_window_wants_every_quarter_to_climb():
    fw = FastWindow(40.0)
    for i in range(14):
        fw.add(i * 3.0, 10 * GIB + CRIT * i * 3.0)
    assert fw.slope(0.9 * CRIT) == pytest.approx(CRIT, rel=0.05)
    # two big allocations inside the window: steep, but not a climb
    fw = FastWindow(40.0)
    for i in range(14):
        fw.add(i * 3.0, 10 * GIB + (1200 * MIB if i >= 5 else 0) + (800 * MIB if i >= 9 else 0))
    assert fw.slope(0.9 * CRIT) is None


def test_lifecycle_phases():
    s = series(started=T0)
    phases = {}
    for i in range(900):
        el = i * 2.0
        # loading 60 s in bursts, a warm-up peak, then flat with churn given back
        v = 16 * GIB * math.ceil(min(el, 60) / 10) / 6 + (2 * GIB if 90 < el < 110 else 0)
        v += 800 * MIB if int(el) % 8 < 2 else 0
        s.update(T0 + el, v)
        phases.setdefault(s.phase, el)
    assert phases[LOADING] == 0
    assert 60 < phases[WARMUP] < 180  # the first pause after the load
    assert phases[WARMUP] + 120 <= phases[STEADY] < 900
    # a reload (memory released, loaded again) starts over
    s.update(T0 + 1800.0, 0.3 * GIB)
    assert s.phase == LOADING


def test_old_processes_are_steady_at_once():
    s = series(started=T0 - 3 * 3600)
    s.update(T0, 20 * GIB)
    assert s.phase == STEADY


def test_growth_from_the_start_is_loading_only_so_long():
    # a process that grows from its first second and never pauses: taken for loading for
    # loading_max_seconds, then judged like any other growth at a steady pace
    s = series(started=T0)
    changes = feed(s, lambda el: GIB + 5 * MIB * el, 900, dt=2.0)
    assert changes and changes[0][1] == 1
    assert LifecycleConfig().loading_max_seconds < changes[0][0] <= 90 + 300
    assert s.judged_phase == LOADING


def test_a_smooth_load_of_three_minutes_is_not_a_leak():
    s = series(started=T0)
    assert feed(s, lambda el: GIB + 100 * MIB * min(el, 180), 1800, dt=2.0) == []


# -- one series ----------------------------------------------------------------------------


def test_12_mib_per_minute_found_within_30_minutes():
    s = series()
    onset = 3600.0
    changes = feed(s, lambda el: 20 * GIB + saw(el) + WARN * max(0.0, el - onset), 2 * 3600)
    assert changes and changes[0][1] == 1
    assert onset < changes[0][0] <= onset + 30 * 60
    assert s.rate == pytest.approx(WARN, rel=0.2)


def test_50_mib_per_second_is_critical_within_60_seconds():
    s = series()
    onset = 3600.0
    changes = feed(s, lambda el: 12 * GIB + saw(el) + CRIT * max(0.0, el - onset), onset + 120)
    assert changes and changes[0][1] == 2
    assert onset < changes[0][0] <= onset + 60


@pytest.mark.parametrize("name,fn", [
    ("sawtooth", lambda el: 20 * GIB + saw(el, 1200 * MIB, 240)),
    ("transient", lambda el: 20 * GIB + saw(el) + (600 * MIB if 3000 < el < 3480 else 0)),
    ("one step", lambda el: 20 * GIB + saw(el) + (800 * MIB if el > 3000 else 0)),
    ("noise", lambda el: 20 * GIB + random.Random(int(el)).gauss(0, 30 * MIB)),
])
def test_no_alarm_without_a_leak(name, fn):
    s = series()
    assert feed(s, fn, 4 * 3600) == [], name


def test_warmup_that_plateaus_is_not_a_leak():
    s = series(started=T0)  # a process that has just started
    def warm(el):
        return 16 * GIB * min(1.0, el / 60) + 5 * GIB * (1 - math.exp(-max(0, el - 60) / 240)) \
            + saw(el, 1 * GIB, 160)
    assert feed(s, warm, 3 * 3600) == []
    assert s.phase == STEADY


def test_leak_resolves_when_the_trend_ends():
    s = series()
    onset, stop = 3600.0, 3600.0 + 3600
    changes = feed(s, lambda el: 20 * GIB + saw(el) + WARN * (min(el, stop) - onset
                                                             if el > onset else 0), 4 * 3600)
    assert [lvl for _, lvl in changes] == [1, 0]
    assert changes[1][0] > stop
    assert changes[1][0] < stop + 45 * 60


# -- analyzer -------------------------------------------------------------------------------


def gpu_tick(t: float, procs, used: float | None = None, probes=()) -> Tick:
    ps = [ProcessSample(pid=pid, name=f"p{pid}", used_memory_bytes=None if v is None else int(v),
                        create_time=ct) for pid, v, ct in procs]
    if used is None:
        used = sum(v or 0 for _, v, _ in procs) + 500 * MIB
    return Tick(t=t, gpus=[GpuSample(index=0, uuid="GPU-0", name=A100[0],
                                     memory_total_bytes=A100[1], memory_used_bytes=int(used),
                                     processes=ps)], probes=list(probes))


def run(pipeline: Pipeline, make_tick, seconds: float, dt: float = 3.0):
    events = []
    for i in range(int(seconds / dt)):
        events += pipeline.update(make_tick(i * dt))
    return events


def test_only_the_leaking_pid_is_flagged():
    onset = 3600.0
    def make(el):
        a = 20 * GIB + saw(el) + WARN * max(0.0, el - onset)
        b = 10 * GIB + saw(el, 900 * MIB, 37)
        return gpu_tick(T0 + el, [(11, a, T0 - 3600), (22, b, T0 - 3600)])
    pipeline = Pipeline(Config(), load_table())
    events = [e for e in run(pipeline, make, 3 * 3600) if e.signal == "memory_leak"]
    firing = [e for e in events if e.state == "firing"]
    assert firing and {e.pid for e in firing} == {11}
    # the event states the value judged and the entry level it reached (slope less tolerance)
    assert firing[0].severity == "warning" and firing[0].threshold == pytest.approx(WARN * 0.9)
    assert firing[0].value >= firing[0].threshold
    assert firing[0].t - T0 - onset <= 30 * 60
    d = pipeline.derived
    assert d.processes[("GPU-0", 11)].leak_rate_bytes_per_second == pytest.approx(WARN, rel=0.25)
    assert abs(d.processes[("GPU-0", 22)].leak_rate_bytes_per_second) < WARN / 4
    assert d.processes[("GPU-0", 11)].phase == STEADY
    # the GPU's rate is what its parts add up to; time to OOM = headroom / rate
    gpu = d.gpus["GPU-0"]
    assert gpu.leak_rate_bytes_per_second == pytest.approx(WARN, rel=0.3)
    assert gpu.time_to_oom_seconds > 0


def test_gpu_level_leak_without_per_process_figures():
    onset = 3600.0
    def make(el):
        used = 30 * GIB + saw(el) + WARN * 1.5 * max(0.0, el - onset)
        return gpu_tick(T0 + el, [(11, None, T0 - 3600)], used=used)
    pipeline = Pipeline(Config(), load_table())
    firing = [e for e in run(pipeline, make, 3 * 3600)
              if e.signal == "memory_leak" and e.state == "firing"]
    assert firing and firing[0].pid is None and firing[0].gpu_uuid == "GPU-0"
    assert "GPU 0" in firing[0].message


def test_restart_resets_the_baseline():
    # The same pid restarts (new create time) and warms up again: no leak.
    def make(el):
        ct = T0 - 3600 if el < 3600 else T0 + 3600
        age = el + 3600 if el < 3600 else el - 3600
        v = 4 * GIB * min(1.0, age / 60) + 3 * GIB * (1 - math.exp(-age / 300)) + saw(el)
        return gpu_tick(T0 + el, [(11, v, ct)])
    pipeline = Pipeline(Config(), load_table())
    events = run(pipeline, make, 3 * 3600)
    assert [e for e in events if e.signal == "memory_leak"] == []
    assert pipeline.derived.processes[("GPU-0", 11)].phase == STEADY


def test_probe_reserved_bytes_are_preferred():
    onset = 3600.0
    def make(el):
        reserved = 8 * GIB + saw(el) + WARN * 2 * max(0.0, el - onset)
        probe = ProbeSample(pid=11, t=T0 + el, reserved_bytes=int(reserved),
                            allocated_bytes=int(reserved / 2))
        # NVML's figure stays flat (say the driver reports it late): the probe's wins
        return gpu_tick(T0 + el, [(11, 9 * GIB, T0 - 3600)], probes=[probe])
    pipeline = Pipeline(Config(), load_table())
    firing = [e for e in run(pipeline, make, 2.5 * 3600)
              if e.signal == "memory_leak" and e.state == "firing"]
    assert firing and firing[0].pid == 11 and "allocator reserved" in firing[0].message


def test_gone_process_resolves_its_leak():
    onset = 3600.0
    def make(el):
        procs = [(22, 5 * GIB, T0 - 3600)]
        if el < 3 * 3600:
            procs.append((11, 20 * GIB + CRIT * max(0.0, el - onset), T0 - 3600))
        return gpu_tick(T0 + el, procs, used=60 * GIB)
    pipeline = Pipeline(Config(), load_table())
    events = [e for e in run(pipeline, make, 3 * 3600 + 300) if e.signal == "memory_leak"]
    assert next((e.pid, e.state) for e in events if e.pid == 11) == (11, "firing")
    assert [(e.pid, e.state) for e in events if e.pid == 11][-1] == (11, "resolved")


def test_same_ticks_give_the_same_events():
    sc = next(s for s in bench.scenarios(3, 3) if s.name == "two_procs")
    def once():
        p = Pipeline(Config(), load_table())
        return [e for tick in bench.ticks(sc, 3, 3, 3.0) for e in p.update(tick)]
    first, second = once(), once()
    assert first and first == second


def test_disabled_leak_detection_reports_nothing():
    cfg = load(None, environ={}, overrides={"signals": {"leak": {"enabled": False}}})
    pipeline = Pipeline(cfg, load_table())
    events = run(pipeline, lambda el: gpu_tick(T0 + el, [(11, GIB + CRIT * el, T0 - 3600)]),
                 600)
    assert [e for e in events if e.signal == "memory_leak"] == []
    assert pipeline.derived.gpus["GPU-0"].leak_rate_bytes_per_second is None


def test_config_overrides_the_table_slopes():
    cfg = load(None, environ={}, overrides={
        "signals": {"leak": {"warning_bytes_per_second": 1000, "critical_bytes_per_second": 2e6}}
    })
    params = LeakParams.from_config(cfg.signals.leak, load_table())
    assert (params.warning, params.critical) == (1000, 2e6)


# -- the benchmark's traces: the goals of the issue ------------------------------------------


@pytest.mark.parametrize("seed", [
    pytest.param(0, marks=pytest.mark.xfail(strict=True, reason=(
        "known miss: 128 MiB kept every 10 min under a sawtooth is not found in 3 h"))),
    pytest.param(1, marks=pytest.mark.xfail(strict=True, reason=(
        "known miss: 12 MiB/min under a 17 s sawtooth next to a busy process is not "
        "found in 3 h (its block values beat against the sawtooth by a ramp's step, and "
        "the floor window does not cover the beat)"))),
])
def test_benchmark_traces_meet_the_goals(seed):
    for sc in bench.scenarios(seed, 4):
        if not sc.attributed:
            continue
        r = bench.score(sc, bench.run_gpuwatch(sc, seed, 4, 3.0))
        assert r["false_alarms"] == 0, sc.name
        if not sc.leaking:
            continue
        assert r["latency"] is not None, sc.name
        if sc.name in ("leak_12mib_min", "two_procs"):
            assert r["latency"] <= 30 * 60, sc.name
        if sc.name == "leak_50mib_s":
            assert r["latency"] <= 60, sc.name


# -- metrics --------------------------------------------------------------------------------


def test_leak_metrics_present_for_every_judged_series():
    """Rate, time to OOM and verdict on every scrape for every tracked process: 0 / +Inf /
    0 while nothing leaks (a gap would restart an alert's `for:`)."""
    onset = 3600.0
    pipeline = Pipeline(Config(), load_table())
    ticks = []
    def make(el):
        t = gpu_tick(T0 + el, [(11, 20 * GIB + saw(el) + WARN * max(0.0, el - onset), T0 - 7200),
                               (33, 2 * GIB, T0 + el - 1)])  # 33 has just started
        ticks.append(t)
        return t
    seen_gaps = []
    for i in range(int(2 * 3600 / 3)):
        pipeline.update(make(i * 3.0))
        m = {f.name: f for f in memory_signals.collect(
            Snapshot(tick=ticks[-1], derived=pipeline.derived))}
        for name in ("gpuwatch_process_memory_leak_rate_bytes_per_second",
                     "gpuwatch_process_time_to_oom_seconds",
                     "gpuwatch_process_memory_leak_severity"):
            if {s.labels["pid"] for s in m[name].samples} != {"11", "33"}:
                seen_gaps.append((i, name))
        for name in ("gpuwatch_gpu_memory_leak_rate_bytes_per_second",
                     "gpuwatch_gpu_time_to_oom_seconds", "gpuwatch_gpu_memory_leak_severity",
                     "gpuwatch_gpu_time_to_oom_severity"):
            if len(m[name].samples) != 1:
                seen_gaps.append((i, name))
    assert seen_gaps == []
    procs = {s.labels["pid"]: s for s in m["gpuwatch_process_memory_leak_rate_bytes_per_second"]
             .samples}
    assert procs["11"].labels == {"gpu": "0", "uuid": "GPU-0", "pid": "11", "process": "p11",
                                  "namespace": "", "pod": "", "container": "",
                                  "slurm_job_id": ""}
    assert procs["11"].value == pytest.approx(WARN, rel=0.25)
    assert procs["33"].value == 0.0  # just started, not growing: 0, not absent
    sev = {s.labels["pid"]: s.value for s in m["gpuwatch_process_memory_leak_severity"].samples}
    assert sev == {"11": 1, "33": 0}
    ttoom = {s.labels["pid"]: s.value for s in m["gpuwatch_process_time_to_oom_seconds"].samples}
    assert ttoom["33"] == math.inf and 0 < ttoom["11"] < math.inf
    assert m["gpuwatch_gpu_memory_leak_severity"].samples[0].value == 0  # the GPU's own
    assert m["gpuwatch_gpu_time_to_oom_seconds"].samples[0].value > 0
    assert m["gpuwatch_gpu_memory_zone"].samples[0].value == 0


# -- behaviours pinned: a mutation of either line fails here ---------------------------------


def _fixed_floor(blocks: int) -> RetainedFloor:
    """A floor whose window is fixed at `blocks` blocks of 15 s, past its first block (the
    series' first, cut short by its start, is not judged: block -1 here)."""
    f = RetainedFloor(15.0, 15.0 * blocks, 15.0 * blocks, 3600.0, 2880.0, 16 * MIB)
    f.add(-1.0, 0.0)
    return f


def test_the_series_first_block_is_not_judged():
    """Seen first in the middle of a block, a server under churn: two of its three samples
    are peaks. Its first block is no level it kept, nor what it gave back when the peaks
    went: the floor starts at the next block."""
    f = RetainedFloor(15.0, 15.0, 15.0, 3600.0, 2880.0, 16 * MIB)
    for t, v in [(9.0, 16 * GIB + 700 * MIB), (11.0, 16 * GIB), (13.0, 16 * GIB + 750 * MIB)]:
        f.add(t, v)
    for t in range(15, 75, 2):
        f.add(float(t), 16 * GIB + (700 * MIB if t % 4 == 1 else 0))
    assert len(f.points) == 3 and set(f.points) == {16 * GIB}


@pytest.mark.parametrize(("cut_start", "noise"), [(True, 0), (False, 2 * GIB)])
def test_what_windows_cut_short_by_the_start_gave_back_is_no_noise(cut_start, noise):
    """First seen during a checkpoint (2 GiB more for 45 s, then given back): the points
    over the first floor window, which the series' start cut short, hold the peak, and its
    fall is no noise of the series at any scale. A GPU's sum (cut_start off) counts it: its
    members ran before it was first seen, and those falls are all it tells yet."""
    f = RetainedFloor(15.0, 75.0, 75.0, 3600.0, 2880.0, 16 * MIB, cut_start=cut_start)
    sc = leak_scales(LeakConfig(), f)
    for t in range(-1, 1800, 5):  # past the longest scale
        if f.add(float(t), 10 * GIB + (2 * GIB if t < 45 else 0)):
            sc.update(0.2 * MIB)
    assert f.at(0) == 10 * GIB
    assert [sc.noise(i) for i in range(len(sc.scales))] == [noise] * len(sc.scales)


def test_floor_window_evicts_exactly_floor_window_blocks():
    """The retained point of block k is the lowest block value of blocks k-4..k."""
    f = _fixed_floor(5)
    values = [0.0] + [100.0 + k for k in range(1, 9)]  # a dip in block 0 only
    for k, v in enumerate(values):
        f.add(k * 15.0 + 1, v)
        f.add(k * 15.0 + 8, v)  # two samples each: a block's value is its second smallest
    pts = list(f.points)  # blocks 0..7 closed
    assert pts[4] == 0.0  # block 4: blocks 0..4, the dip is still in
    assert pts[5] == 101.0  # block 5: blocks 1..5, the dip has left


def test_a_load_that_ends_in_the_open_block_does_not_break_the_floor():
    """The origin falls in the block still open: that block closes with its full window,
    the blocks after it reach back no further than the origin."""
    f = _fixed_floor(5)
    for k in range(4):
        f.add(k * 15.0 + 1, 0.0 if k == 0 else 100.0)
        f.add(k * 15.0 + 8, 0.0 if k == 0 else 100.0)
    f.set_origin(3 * 15.0 + 8)  # block 3 is open: the origin is block 4
    for k in range(4, 7):
        f.add(k * 15.0 + 1, 100.0 + k)
        f.add(k * 15.0 + 8, 100.0 + k)
    pts = list(f.points)  # blocks 0..5 closed
    assert pts[3] == 0.0  # block 3, before the origin: blocks 0..3
    assert pts[4:] == [104.0, 104.0]  # from the origin on: not back into blocks 0..3


def test_one_sample_caught_low_does_not_hold_the_floor_down():
    f = floor_of(lambda el: 20 * GIB - (600 * MIB if el == 150.0 else 0) + WARN * el, 600)
    lows = list(f.points)
    assert min(lows) >= 20 * GIB - MIB  # the lone 600 MiB dip never shows
    assert all(b > a for a, b in itertools.pairwise(lows))


def _scales_on(first_rate: float, second_rate: float):
    """Scales over retained memory that rose at first_rate (bytes/s) for 12 min, then at
    second_rate, and its 24-min scale's evidence."""
    cfg = LeakConfig()
    f = _fixed_floor(1)
    sc = leak_scales(cfg, f)
    v, out = 20.0 * GIB, None
    for k in range(2 * 96 + 1):
        rate = first_rate if k < 96 + 48 else second_rate
        v += rate * 15.0
        f.add(k * 15.0 + 1, v)
        f.add(k * 15.0 + 8, v)
        if k > 1:
            out = sc.update(LeakParams.from_config(cfg, load_table()).warn_on)
    return next(e for e in out if e.scale == 1440.0)


def test_levelling_guard_refuses_growth_that_levels_off():
    # both halves of the 24-min window rise, the second at 0.5 of the first: a leak ...
    assert _scales_on(8 * WARN, 4 * WARN).shaped
    # ... but a second half under 0.4 of the first is warm-up levelling off
    assert not _scales_on(8 * WARN, 2.8 * WARN).shaped
    assert _scales_on(8 * WARN, 3.4 * WARN).shaped
    # and a second half that barely rises is one step, not a leak
    assert not _scales_on(WARN, 0.05 * WARN).shaped


# -- one episode, hysteresis and the life cycle -----------------------------------------------


def _episodes(events, signal="memory_leak"):
    return [(e.state, e.severity, e.pid) for e in events if e.signal == signal]


def test_a_steady_leak_is_one_episode_with_no_resolve():
    """50 MiB/s under a sawtooth whose drops make the fast path miss ticks: the verdict
    holds through them (it did not: every miss resolved and re-fired the event)."""
    def make(el):
        v = 10 * GIB + saw(el, 256 * MIB, 45) + CRIT * max(0.0, el - 60)
        return gpu_tick(T0 + el, [(11, v, T0 - 3600)], used=v + 30 * GIB)
    pipeline = Pipeline(Config(), load_table())
    events = run(pipeline, make, 900, dt=2.0)
    assert _episodes(events) == [("firing", "critical", 11)]
    assert _episodes(events, "time_to_oom") == [("firing", "critical", None)]


def test_the_recording_that_flapped_replays_as_one_episode():
    """Recorded live on `--simulate leak` (50 MB/s then) before the fix: 8 resolve/fire
    pairs in 7 minutes. The same ticks now give one firing event per signal."""
    from gpuwatch.recording import read_recording

    _, ticks = read_recording(str(TRACES / "sim-leak-flapped.jsonl.gz"))
    pipeline = Pipeline(Config(), load_table())
    events = [e for tick in ticks for e in pipeline.update(tick)]
    assert [(e.signal, e.state) for e in events] == [
        ("memory_leak", "firing"), ("time_to_oom", "firing")]


def test_a_critical_leak_that_stops_resolves_once_after_its_hold():
    stop = 600.0
    def make(el):
        v = 10 * GIB + saw(el, 256 * MIB, 45) + 64 * MIB * (min(el, stop) - 60 if el > 60 else 0)
        return gpu_tick(T0 + el, [(11, v, T0 - 3600)], used=v + 20 * GIB)
    pipeline = Pipeline(Config(), load_table())
    events = [e for e in run(pipeline, make, 2400, dt=2.0) if e.signal == "memory_leak"]
    assert [(e.state, e.severity) for e in events] == [("firing", "critical"),
                                                        ("resolved", "critical")]
    assert events[1].ref == events[0].id
    # the exit level (25 MiB/s) is crossed within the 40 s window; then 5 min of hold
    assert stop + 300 <= events[1].t - T0 <= stop + 300 + 60


def test_a_new_source_keeps_the_verdict_and_the_phase():
    s = series(started=T0)  # just started: loading
    life = s.life
    s.verdict.judge(T0, 2, CRIT, CRIT * 0.9, s.phase, None, 0.0, 0.0, 0.0)
    s.rebase()  # what a change of source does (baselines only)
    assert s.level == 2 and life is s.life


@pytest.mark.parametrize(("last", "value", "scale"), [
    (0.0, 52.5 * MIB, 120.0),  # the 2-min scale alone
    (500 * MIB, 52.5 * MIB, 120.0),  # and the fast path at 46.7 MiB/s
    (900 * MIB, 60 * MIB, None),  # and the fast path at 60 MiB/s
])
def test_a_critical_scale_and_fast_path_at_once_report_the_larger_rate(last, value, scale):
    # a leak kept each block in uneven steps (1700 and 100 MiB in turn: the fast path's
    # parts do not all climb), then 450, 450 and `last`: the fast path's window holds
    # three climbing steps only as the 2-min scale confirms (52.5 MiB/s), in that tick
    onset = 1500.0
    steps = [1700 * MIB, 100 * MIB] * 3 + [450 * MIB, 450 * MIB, last]

    def fn(el):
        return 20 * GIB + (sum(steps[:int((el - onset) // 15) + 1]) if el >= onset else 0)

    s = series()
    assert feed(s, fn, onset + 15 * len(steps) + 60, dt=1.0) == [(onset + 120, 2)]
    assert s.value == pytest.approx(value) and s.verdict.scale == scale


def _young(el, onset, rate=64 * MIB, burst_load=True):
    """A process that starts at T0: loads 8 GiB in 6 bursts over 24 s, warms up with a
    peak, serves with churn returned to the driver every 4 s, and leaks from `onset`."""
    if el < 24:
        v = 8 * GIB * (math.ceil(el / 4) / 6 if burst_load else el / 24)
    else:
        v = 8 * GIB + 2 * GIB * min(1.0, (el - 24) / 30)
        v += (1.5 * GIB * math.sin(math.pi * (el - 24) / 30) if el < 54 else 0)
        v += 900 * MIB if int(el) % 4 < 2 else 0  # churn, given back with empty_cache()
    v += random.Random(int(el * 10)).gauss(0, 8 * MIB)
    return v + (rate * (el - onset) if el > onset else 0)


@pytest.mark.parametrize("onset", [60.0, 150.0, 200.0])
def test_a_leak_in_the_first_minutes_is_critical_within_60_seconds(onset):
    s = series(started=T0)
    changes = feed(s, lambda el: _young(el, onset), onset + 120, dt=1.0)
    assert changes and changes[0][1] == 2, changes
    assert onset < changes[0][0] <= onset + 60
    assert s.phase != STEADY and s.judged_phase in (LOADING, WARMUP)


@pytest.mark.parametrize("burst_load", [True, False])
def test_loading_warmup_and_churn_are_not_a_leak(burst_load):
    s = series(started=T0)
    assert feed(s, lambda el: _young(el, math.inf, burst_load=burst_load), 1800, dt=1.0) == []


def test_growth_in_warmup_that_would_not_fill_the_gpu_within_the_horizon_waits():
    # 50 MiB/s for 60 s only fills 3 GiB; with 20 GiB of headroom left that projects
    # 7 min, critical; with 1 TiB left it projects 6 h: beyond the 2 h horizon
    for headroom, fires in ((20 * GIB, True), (1 << 40, False)):
        s = series(started=T0)
        for i in range(200):
            el = float(i)
            s.update(T0 + el, _young(el, 120.0, rate=CRIT), headroom)
        assert (s.level == 2) is fires


def _fed(pipeline: Pipeline, pid: int) -> list[float]:
    series = pipeline.analyzers[1]._procs[("GPU-0", pid)].series
    return [t for t, _ in series.fast.samples]


@pytest.mark.parametrize("dt, gap", [(1.0, 3.0), (0.7, 2.8), (2.0, 2.0), (5.0, 5.0)])
def test_a_process_series_takes_about_one_sample_per_interval(dt, gap):
    """Ticks faster than sample_interval_seconds are thinned (8 x 64 processes at 1 s cost
    what the detector needs, no more); a 50 MiB/s leak is still critical within 60 s."""
    onset = 300.0
    def make(el):
        return gpu_tick(T0 + el, [(11, 20 * GIB + saw(el) + CRIT * max(0.0, el - onset),
                                   T0 - 3600)])
    pipeline = Pipeline(Config(), load_table())
    events = run(pipeline, make, onset + 60, dt=dt)
    gaps = {round(b - a, 3) for a, b in itertools.pairwise(_fed(pipeline, 11))}
    assert gaps == {gap}
    firing = [e for e in events if e.signal == "memory_leak" and e.state == "firing"]
    assert firing and firing[0].severity == "critical" and firing[0].t - T0 - onset <= 60


def test_sample_interval_zero_takes_every_tick():
    cfg = load(overrides={"signals": {"leak": {"sample_interval_seconds": 0}}})
    pipeline = Pipeline(cfg, load_table())
    run(pipeline, lambda el: gpu_tick(T0 + el, [(11, 20 * GIB, T0 - 3600)]), 60, dt=1.0)
    assert {round(b - a, 3) for a, b in itertools.pairwise(_fed(pipeline, 11))} == {1.0}


def test_shortened_windows_are_not_thinned_below_what_they_need():
    # a 10 s critical window at 1 s ticks needs every tick: a dozen samples per window
    cfg = load(overrides={"signals": {"leak": {"critical_window_seconds": 10}}})
    pipeline = Pipeline(cfg, load_table())
    run(pipeline, lambda el: gpu_tick(T0 + el, [(11, 20 * GIB, T0 - 3600)]), 60, dt=1.0)
    assert {round(b - a, 3) for a, b in itertools.pairwise(_fed(pipeline, 11))} == {1.0}


def test_a_start_time_learnt_late_still_tells_a_restart_apart():
    pipeline = Pipeline(Config(), load_table())
    # first samples without a start time, then with one, then another process on that pid
    for k in range(5):
        pipeline.update(gpu_tick(T0 + 3 * k, [(11, 20 * GIB, None)]))
    for k in range(5, 10):
        pipeline.update(gpu_tick(T0 + 3 * k, [(11, 20 * GIB, T0 - 3600)]))
    first = pipeline.analyzers[1]._procs[("GPU-0", 11)]
    pipeline.update(gpu_tick(T0 + 30, [(11, 5 * GIB, T0 + 29)]))
    again = pipeline.analyzers[1]._procs[("GPU-0", 11)]
    assert again is not first and again.create_time == T0 + 29


def test_the_detectors_median_is_the_statistics_one():
    # the daemon's own median (statistics would import decimal, fractions and random)
    import statistics

    from gpuwatch.signals.leak.robust import median

    rng = random.Random(7)
    for n in range(1, 40):
        values = [rng.uniform(-1e9, 1e9) for _ in range(n)]
        assert median(values) == statistics.median(values)
    assert median([3, 1, 2, 4]) == 2.5
    with pytest.raises(ValueError):
        median([])
