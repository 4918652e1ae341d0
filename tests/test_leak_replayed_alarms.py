"""Traces of the first benchmark family on which the leak detector once raised a false alarm
or split one leak into several episodes, replayed through the daemon's pipeline."""

from __future__ import annotations

import pytest

from benchmarks import leak_detection as bench
from gpuwatch.config import Config
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.leak import FastWindow, LeakParams, RetainedFloor
from gpuwatch.signals.leak.series import scales_of
from gpuwatch.signals.memory import MemoryAnalyzer
from gpuwatch.thresholds import load_table

MIB = 1 << 20
GIB = 1 << 30
CRIT = 50 * MIB
WARN = 12 * MIB / 60
T0 = 1_767_225_600.0
HOURS = 4


def _score(name: str, seed: int) -> dict:
    sc = next(s for s in bench.scenarios(seed, HOURS) if s.name == name)
    return bench.score(sc, bench.run_gpuwatch(sc, seed, HOURS, 3.0))


# Only the GPU's total is known and two busy processes add up their sawtooth and transients:
# seeds 0, 11, 12 raised warnings (the floor of the sum wandered with the beat of the two
# sawtooths, transients on top), seeds 2 and 18 critical ones (a fast sawtooth ramp topped by
# one transient allocation); seeds 1 and 33 warnings 6-8 min in (the two members' warm-ups,
# summed, judged as growth that never paused), seeds 7 and 24 warnings 27-32 min in (the
# sum's 20-min scale, judged on the noise of its first few minutes of windows).
@pytest.mark.parametrize("seed", [0, 1, 2, 7, 11, 12, 18, 24, 33])
def test_two_busy_processes_seen_only_as_the_gpu_total_raise_no_alarm(seed):
    r = _score("gpu_only_busy", seed)
    assert r["false_alarms"] == 0, r


# The floor of two summed sawtooths drifts with their beat (periods 206 s and 218 s: a beat
# of an hour; 247 s and 258 s: 1.6 h) against a 12 MiB/min leak: it used to resolve when the
# drift cancelled the leak for half a beat and fire again on the upswing.
@pytest.mark.parametrize("seed", [4] + [pytest.param(s, marks=pytest.mark.xfail(
    strict=True, reason="known miss: two episodes on the GPU's total (its warning resolves "
    "and fires again)")) for s in (28, 31)])
def test_a_leak_seen_only_in_the_gpu_total_is_one_episode(seed):
    r = _score("gpu_only_leak", seed)
    assert r["false_alarms"] == 0, r
    assert r["latency"] is not None, r
    assert r["episodes"] == 1, r


def test_the_gpu_total_of_several_processes_is_judged_on_longer_windows():
    cfg = Config().signals.leak
    ma = MemoryAnalyzer(Config(), load_table())
    k = cfg.sum_window_factor
    assert k >= 2
    assert ma.sum_params.cfg.scales_seconds == [k * s for s in cfg.scales_seconds]
    sc = next(s for s in bench.scenarios(0, HOURS) if s.name == "gpu_only_busy")
    for tick in bench.ticks(sc, 0, 0.01, 3.0):
        ma.update(tick, Derived(), Conditions())
    assert ma._gpus["GPU-bench-0"].series.p is ma.sum_params
    # with per-process figures, the GPU's series (memory no process accounts for) is not a
    # sum of allocators: the ordinary windows
    sc = next(s for s in bench.scenarios(0, HOURS) if s.name == "two_procs")
    ma = MemoryAnalyzer(Config(), load_table())
    for tick in bench.ticks(sc, 0, 0.01, 3.0):
        ma.update(tick, Derived(), Conditions())
    assert ma._gpus["GPU-bench-0"].series.p is ma.params


def test_a_ramp_at_half_the_pace_topped_by_one_allocation_is_not_a_fast_leak():
    # gpu_only_busy seed 18 at 4755 s: the sum of two sawtooths climbs 24.5 MiB/s and a
    # 671 MiB transient lands in the last quarter: every quarter's minimum rose by more than
    # half the pace and the whole by 46 MiB/s, but one step carried most of it
    fw = FastWindow(40.0)
    for i in range(14):
        t = i * 3.0
        fw.add(t, 54 * GIB + 24.5 * MIB * t + (700 * MIB if t >= 32 else 0))
    assert fw.slope(0.9 * CRIT) is None
    # the same rise spread evenly is a leak that fast
    fw = FastWindow(40.0)
    for i in range(14):
        t = i * 3.0
        fw.add(t, 54 * GIB + 48 * MIB * t)
    assert fw.slope(0.9 * CRIT) == pytest.approx(48 * MIB, rel=0.05)


@pytest.mark.xfail(strict=True, reason="known false alarm: two transients of 6 and 9 min, "
                   "one after the other, longer than the floor window, pass the 24-min halves")
def test_transients_that_follow_one_another_are_not_a_leak_next_to_one():
    # two_procs seed 11: the neighbour that does not leak (sawtooth of 271 s, near the floor
    # window) had a 279 MiB transient for 6 min, then a 788 MiB one for 9 min; the floor
    # climbed in two stairs, a 25.6 MiB/min trend whose first half rose only 5 MiB/min
    r = _score("two_procs", 11)
    assert r["false_alarms"] == 0, r
    assert r["latency"] is not None and r["latency"] <= 30 * 60, r  # the leaking pid still


def test_a_rise_that_one_half_of_the_window_carries_is_not_a_leak():
    # two_procs seed 11, the neighbour's retained memory (MiB, one point a minute) when the
    # old detector fired: flat at 28172 under two stairs of transients, the second not yet
    # come back down
    floors = ([28377] * 3 + [28172] * 5 + [28238] + [28432] * 4 + [28447] + [28408] * 5
              + [28610, 28790, 28944] + [28965] * 3)
    cfg = Config().signals.leak
    f = RetainedFloor(15.0, 15.0, 15.0, 3600.0, 2880.0, 16 * MIB)
    sc = scales_of(cfg, f)
    warn_on = LeakParams.from_config(cfg, load_table()).warn_on
    for k in range(2 * 96):
        v = floors[max(0, (k - 2 * 96 + 100) // 4)] * MIB  # the last 25 min, a point a minute
        f.add(k * 15.0 + 1, v)
        f.add(k * 15.0 + 8, v)
        ev = sc.update(warn_on)
    long = next(e for e in ev if e.scale == 1440.0)
    assert long.rate == pytest.approx((28965 - 28377) * MIB / 1440, rel=0.05)
    assert long.rising and not long.shaped  # above the warning slope, but in two stairs
    assert not any(e.shaped for e in ev)
