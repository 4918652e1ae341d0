"""Window edges, histogram_quantile interpolation inside inner buckets, and the counter
banks' resets, folding and replicas."""

from __future__ import annotations

import math

import pytest

from gpuwatch.signals.windows import (
    MAX_MODELS,
    CounterBank,
    EngineCounters,
    Window,
    histogram_quantile,
)

INF = math.inf


@pytest.mark.parametrize(("q", "bounds", "counts", "expected"), [
    (0.5, (1.0, INF), [2, 2], 0.5),  # two buckets are enough
    (0.5, (0.5, INF), [4, 4], 0.25),  # a first bound below 1: from 0 up to it, like any
    (0.5, (0.0, 1.0, INF), [0, 4, 4], 0.5),  # a bucket at 0 first: the next one from 0
    (0.5, (1.0, 2.0, INF), [1, 3, 3], 1.25),  # second bucket: starts at the first bound
    (0.75, (1.0, 2.0, INF), [1, 2, 2], 1.5),  # a bucket holding a single observation
    (0.99, (1.0, 2.0, INF), [1, 2, 3], 2.0),  # in +Inf: the highest finite bound
])
def test_histogram_quantile_by_hand(q, bounds, counts, expected):
    assert histogram_quantile(q, bounds, counts) == pytest.approx(expected)


def test_window_keeps_the_newest_snapshot_at_the_start():
    w = Window(10.0)
    for t, v in ((0.0, 0.0), (5.0, 5.0), (10.0, 10.0), (15.0, 30.0)):
        w.push(t, {"x": v})
    # The window starts at 5: the snapshot at exactly 5 is its base, the one at 0 is gone.
    assert w.increase("x") == (25.0, 10.0)
    assert w.base(["x"]) == (5.0, {"x": 5.0})


def test_window_needs_two_snapshots():
    w = Window(10.0)
    w.push(0.0, {"x": 1.0})
    assert w.base(["x"]) is None and w.increase("x") is None
    w.push(1.0, {"y": 1.0})
    assert w.base(["x"]) is None  # the newest snapshot lacks x


def test_a_reset_adds_the_counters_last_value_to_its_total_and_nothing_more():
    bank = CounterBank()
    bank.update({"core": {"requests": 10.0, "tokens": 0.0}})
    assert bank.update({"core": {"requests": 3.0, "tokens": 5.0}}) is True
    assert bank.totals() == {"requests": 13.0, "tokens": 5.0}


def test_folded_totals_are_kept_for_at_most_max_models_and_grow_for_those_kept():
    """One group per model, MAX_MODELS + 1 models, all gone: the first MAX_MODELS keep
    their totals, the one more does not (its counts stay in the engine's totals). A later
    group of a kept model adds to that model's folded total."""
    bank = CounterBank(expire_after=1)
    n = MAX_MODELS + 1
    bank.update({f"g{i}": {"x": 1.0} for i in range(n)},
                models={f"g{i}": f"m{i}" for i in range(n)})
    bank.update({})  # all of them folded
    bank.update({"h0": {"x": 5.0}}, models={"h0": "m0"})
    bank.update({})
    by_model = bank.totals_by_model()
    assert len(by_model) == MAX_MODELS and f"m{n - 1}" not in by_model
    assert by_model["m0"] == {"x": 6.0}
    assert bank.totals() == {"x": n + 5.0}


def test_three_replicas_answering_in_turn_at_one_url_are_three():
    counters = EngineCounters()
    for i in range(6):
        counters.update((100.0, 200.0, 300.0)[i % 3], {"core": {"requests": float(i)}})
    assert counters.replicas() == 3


def test_a_counter_that_appears_later_in_a_group_is_no_reset():
    bank = CounterBank()
    bank.update({"core": {"requests": 10.0}})
    assert bank.update({"core": {"requests": 12.0, "errors": 0.0}}) is False
    assert bank.totals() == {"requests": 12.0, "errors": 0.0}


def test_a_restarted_engines_folded_totals_stay_in_its_models_totals():
    counters = EngineCounters(expire_after=1)
    counters.update(100.0, {"core": {"requests": 10.0}}, models={"core": "llama"})
    counters.update(200.0, {"core": {"requests": 1.0}}, models={"core": "llama"})  # restarted
    counters.update(200.0, {"core": {"requests": 2.0}}, models={"core": "llama"})
    assert counters.totals_by_model() == {"llama": {"requests": 12.0}}
    assert counters.totals() == {"requests": 12.0}
