"""Cases of the generated family of issue 19 (benchmarks/leak_rates.py) that the detector
once missed: each is run through the whole pipeline and scored as the benchmark scores it."""

from __future__ import annotations

import pytest

from benchmarks import leak_rates as lr
from gpuwatch.config import Config
from gpuwatch.signals.leak import LeakParams, LeakSeries
from gpuwatch.thresholds import load_table

MIB = 1 << 20


def _case(cases, name: str) -> lr.Case:
    return next(c for c in cases if c.name == name)


@pytest.mark.parametrize(("seed", "name"), [(0, "steps 256 MiB every 120s/none"),
                                            (0, "steps 1024 MiB every 120s/churn")])
def test_a_leak_kept_in_steps_minutes_apart_is_found_by_its_third_step(seed, name):
    # the 5-min scale holds two or three steps 2 min apart: judged in quarters, one of them
    # always missed a step and the leak waited for the 10-min scale (12 min)
    case = _case(lr.step_cases(seed), name)
    r = lr.score(case, lr.run(case))
    assert r["met"], r
    assert r["latency_s"] <= case.goal and r["episodes"] == 1, r


@pytest.mark.parametrize(("seed", "name"), [(2, "none/onset 0s/50.2 MiB/s"),
                                            (1, "none/onset 30s/50.2 MiB/s"),
                                            (0, "neighbours/onset 0s/100 MiB/s")])
def test_a_fast_leak_from_the_start_is_told_from_its_load(seed, name):
    # a leak of 50 MiB/s from the start climbs at half the pace of its 512 MiB bursts: no
    # block of the load is four times the median rise, so the load was taken for part of
    # the leak and the growth judged as a whole failed its even quarters for 9 min
    case = _case(lr.leak_cases(seed, rates=[r for r in lr.RATES if r > 40],
                               onsets=[0.0, 30.0], noises=["none", "neighbours"]), name)
    r = lr.score(case, lr.run(case))
    assert r["met"], r


@pytest.mark.parametrize(("seed", "name"), [(1, "ratchet/onset 0s/6.32 MiB/s"),
                                            (2, "ratchet/onset 0s/1.59 MiB/s")])
def test_a_leak_from_the_start_under_a_ratchet_is_judged_from_the_ratchets_first_burst(
        seed, name):
    # dynamic shapes cache a GiB in the first seconds of serving: that burst, far above the
    # leak's pace after it, ends the load; judged from the last burst of the weights, the
    # growth's first quarter carried it and its quarters were uneven until steady (15 min)
    case = _case(lr.leak_cases(seed, rates=[r for r in lr.RATES if 1 < r < 10],
                               onsets=[0.0], noises=["ratchet"]), name)
    r = lr.score(case, lr.run(case))
    assert r["met"], r


def test_a_load_given_back_before_it_ever_paused_is_a_reload_not_a_leak():
    # no-leak host 45: a process loads 10 GiB under a 476 s sawtooth (its retained memory
    # never pauses: still `loading`), gives it back and loads it again; the reload was not
    # recognised before the first pause, and the second load was taken for a critical leak
    case = lr.host(45)
    r = lr.score_host(case, lr.run(case))
    assert r["false_process_episodes"] == 0, r["events"]


def test_growth_that_sped_up_before_its_first_pause_is_judged_on_its_faster_part():
    # 4 GiB in bursts, a warm-up creeping 2 MiB/s, then from 150 s a leak of 30 MiB/s: no
    # pause, and judged from the end of the load its first quarter carried the creep alone
    # (its quarters uneven until the load's tail left the window); its second half is the
    # leak alone
    cfg = Config().signals.leak
    s = LeakSeries(LeakParams.from_config(cfg, load_table()), 0.0)

    def mem(t: float) -> float:
        v = 500 * MIB + 512 * MIB * min(8, int(t // 4))
        v += 2 * MIB * min(max(0.0, t - 32), 118) + 30 * MIB * max(0.0, t - 150)
        return v // (2 * MIB) * 2 * MIB

    fired = None
    for i in range(300):
        t = 2.0 * i
        s.update(t, mem(t))
        if s.level and fired is None:
            fired = t
    assert s.phase == "loading"  # it never paused
    assert fired is not None and fired <= cfg.lifecycle.loading_max_seconds + 120, fired


def test_one_step_kept_under_churn_is_not_a_critical_pace():
    # 1 GiB kept every 10 min under churn of 0.5-1.5 GiB: the maxima of the fast window's
    # quarters climbed by chance (transients of random size) while its minima rose once, at
    # the step; it was critical 14 s after the step, and a second episode at the next one
    case = _case(lr.step_cases(2), "steps 1024 MiB every 600s/churn")
    r = lr.score(case, lr.run(case))
    assert r["critical_latency_s"] is None and r["episodes"] == 1 and r["met"], r


def test_a_leak_under_a_short_sawtooth_from_the_start_is_no_series_of_loads():
    # under a 60 s sawtooth the retained memory of a leak climbs in a staircase, a step a
    # minute, flat between: none of its steps is the load's tail (they follow a flat
    # stretch), or the growth judged as a whole would start again at every step
    case = _case(lr.leak_cases(1, rates=[r for r in lr.RATES if 5 < r < 7], onsets=[30.0],
                               noises=["sawtooth"]), "sawtooth/onset 30s/6.32 MiB/s")
    r = lr.score(case, lr.run(case))
    assert r["met"], r


@pytest.mark.parametrize(("seed", "name"), [(0, "gpu_only/onset 120s/0.399 MiB/s"),
                                            (0, "gpu_only/onset 600s/0.399 MiB/s")])
def test_a_gpu_only_leak_after_a_member_loaded_is_not_lagged_by_the_load(seed, name):
    # GPU-only accounting: the leaking process joins a sum of neighbours and loads; the
    # floor kept its origin at the neighbours' load, so a return reaching back into the new
    # load (765 s) set a 15-min floor window for an hour and the leak waited for it (26 min)
    case = _case(lr.leak_cases(seed, rates=[r for r in lr.RATES if 0.3 < r < 0.5],
                               onsets=[120.0, 600.0], noises=["gpu_only"]), name)
    r = lr.score(case, lr.run(case))
    assert r["met"], r


@pytest.mark.xfail(strict=True, reason=(
    "one neighbour's transient, given back once, sets the sum's floor window (570 s) for "
    "the whole return memory while its sawtooth's period is 120 s: the floor lags the leak "
    "by the window, found after 15 min or never; a return period that must recur shortens "
    "the window, but so far adds false episodes on no-leak sums"))
def test_a_gpu_only_leak_after_a_one_off_transient_is_not_lagged_by_it():
    # three processes, no per-process figures: a leaker, a neighbour with a sawtooth of
    # 120 s and 400 MiB, and one that held 800 MiB more for 6 min, once, 32 min before a
    # leak of 3.17 MiB/s (400 MiB in 2 min) starts
    rate, onset = 3.17 * MIB, 3000.0
    leaker = lr.Proc(2001, 600.0, 11, weights=4 * lr.GIB, leak=lr.Leak(onset, rate))
    saw = lr.Proc(3002, -3000.0, 12, weights=8 * lr.GIB, noise="sawtooth", saw_period=120.0,
                  saw_amp=400 * MIB)
    once = lr.Proc(3003, -600.0, 13, weights=4 * lr.GIB, noise="transients")
    once._transients = [(1900.0, 2260.0, 800 * MIB)]  # its ages: 1300-1660 s into the trace
    case = lr.Case("one-off transient, then a leak", [leaker, saw, once], 600 + onset + 900,
                   lr.GPU_ONLY, leaker.leak, attributed=False, rate=rate, onset=onset,
                   noise="gpu_only", goal=lr.target(rate, onset, saw.saw_period))
    r = lr.score(case, lr.run(case))
    assert r["false_episodes"] == 0 and r["episodes"] == 1, r
    assert r["latency_s"] is not None and r["latency_s"] <= 600.0, r


def test_a_gpu_only_leak_far_beyond_what_the_sum_gave_back_is_held_by_what_it_keeps():
    # GPU-only accounting: the neighbours' transients set the sum's floor window (up to
    # 15 min), so a leak of 3.17 MiB/s shows first on the block values, beyond twice all the
    # sum ever gave back; held for half of the sum's scale it was found in 12.4 min, held
    # like growth that never paused (until it kept 400 MiB more at its pace) within target
    case = _case(lr.leak_cases(1, rates=[r for r in lr.RATES if 3 < r < 4], onsets=[600.0],
                               noises=["gpu_only"]), "gpu_only/onset 600s/3.17 MiB/s")
    r = lr.score(case, lr.run(case))
    assert r["met"] and r["false_episodes"] == 0, r


def test_a_gpu_only_sum_counts_what_its_first_windows_gave_back():
    # the GPU's sum is first seen with its members running: a neighbour's 9-min sawtooth
    # dropped in the sum's first window, before any return was known, and the leaker's load
    # joined before the next drop; its ramp then climbed a 105-s floor at 1.4 MiB/s, and
    # only that first drop, counted as the sum's noise, kept it from a warning before the
    # leak began (a process's series does not count falls from such windows)
    case = _case(lr.leak_cases(0, rates=[r for r in lr.RATES if r < 0.3], onsets=[600.0],
                               noises=["gpu_only"]), "gpu_only/onset 600s/0.2 MiB/s")
    r = lr.score(case, lr.run(case))
    assert r["false_episodes"] == 0, r


@pytest.mark.parametrize(("seed", "name", "within"), [
    (0, "gpu_only/onset 600s/25.2 MiB/s", None),
    (2, "gpu_only/onset 120s/3.17 MiB/s", 600.0)])
def test_a_gpu_only_leak_after_the_leaker_joined_is_judged_once_its_load_ends(seed, name,
                                                                               within):
    # the leaker joining the sum made it load again, until a pause of the sum's floor: flat
    # for 30 s longer than its window (the neighbours' return period, up to 15 min), which
    # neither the leak nor the neighbours allow; the sum was taken for loading for 15 min
    # (25 MiB/s found after 6 min; 3 MiB/s from minute 2 not within 12 min)
    case = _case(lr.leak_cases(seed, rates=[r for r in lr.RATES if 3 < r < 4 or 20 < r < 30],
                               onsets=[120.0, 600.0], noises=["gpu_only"]), name)
    r = lr.score(case, lr.run(case))
    if within is None:
        assert r["met"], r
    else:
        assert r["episodes"] == 1 and r["false_episodes"] == 0, r
        assert r["latency_s"] is not None and r["latency_s"] <= within, r


@pytest.mark.parametrize("seed", [14, 36])
def test_a_no_leak_host_without_per_process_figures_has_no_false_gpu_episode(seed):
    # the same no-leak host, its driver giving no per-process figures: after a member
    # joined, a scale of 20 or 48 min reached back over its load and the loads of the
    # members that came one after the other summed to a leak of 48 min
    case = lr.host(seed)
    case.attributed = False
    r = lr.score_host(case, lr.run(case))
    assert r["false_gpu_episodes"] == 0, r
