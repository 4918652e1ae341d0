"""Growth that never paused, judged as a whole (signals/leak/scales.py, Scales.loading), on
generated cases of the leak-rates family (benchmarks/leak_rates.py)."""

from __future__ import annotations

import pytest

from benchmarks import leak_rates as lr


def _case(noise: str, rate_mib_s: float, onset: float, seed: int) -> lr.Case:
    rates = [r for r in lr.RATES if abs(r - rate_mib_s) / rate_mib_s < 0.05]
    (case,) = lr.leak_cases(seed, rates, [onset], [noise])
    return case


def _score(case: lr.Case) -> dict:
    return lr.score(case, lr.run(case))


@pytest.mark.parametrize(("noise", "rate", "onset", "seed"), [
    # the GPU's used memory alone: the leaker's load and a 200 MiB/s leak right after it,
    # every block rising as steeply as the load did; the sum's lifecycle starts again when
    # the leaker appears (and the GPU fills within 10 min)
    ("gpu_only", 200, 0.0, 0),
    # a 20 s load, a sawtooth of 60 s, and a 100 MiB/s leak 100 s after the load: the
    # floor's flat stretch at the sawtooth's first trough is too short to end loading
    ("sawtooth", 100, 120.0, 1),
])
def test_a_leak_as_steep_as_the_load_is_found_before_any_pause(noise, rate, onset, seed):
    r = _score(_case(noise, rate, onset, seed))
    # found at all (the steep climb was taken for the load's last step for as long as it
    # lasted), at the critical slope, as one episode, nothing before the onset
    assert r["critical_latency_s"] is not None, r
    assert r["episodes"] == 1, r
    assert r["false_episodes"] == 0, r


def test_a_sawtooths_first_ramp_after_a_short_pause_is_not_a_leak():
    # a load, the sawtooth's first trough (the floor flat for a few blocks), then its first
    # ramp of 10 min at about 1.5 MiB/s: no rise beyond what the series gave back (the
    # sawtooth's drop), so no leak before the leak's onset, 10 min into the process
    case = _case("sawtooth", 1.59, 600.0, 1)
    assert case.procs[0].saw_period == 600.0  # the case this guards: a ramp of 10 min
    r = _score(case)
    assert r["false_episodes"] == 0, r


@pytest.mark.parametrize(("noise", "rate", "onset", "seed"), [
    # the GPU's used memory alone, a floor window of several minutes (the neighbours'
    # sawtooth and transients): the lag of the floor hid the whole of the growth, which the
    # block values show
    ("gpu_only", 12.6, 0.0, 0),
    # a slow leak from the first second under churn, on a floor of one block: its blocks
    # rise less than the floor's tolerance, and are no pause (which would cut the growth
    # judged short)
    ("churn", 0.796, 0.0, 1),
])
def test_growth_that_never_paused_meets_its_target(noise, rate, onset, seed):
    r = _score(_case(noise, rate, onset, seed))
    assert r["met"], r


def test_a_long_load_in_bursts_that_ended_is_not_judged_on_its_block_values():
    # a no-leak host: a 35 GiB load in bursts of more than 5 min, then a sawtooth whose first
    # drop widens the floor window to two blocks; the load has ended, as the floor (no lag
    # to speak of) shows, though the block values' quarters still climb
    case = lr.host(41)
    r = lr.score_host(case, lr.run(case))
    assert r["false_process_episodes"] == 0, r
