"""Counter reset handling, sliding windows and histogram_quantile."""

from __future__ import annotations

import math
import random
import shutil
import subprocess

import pytest

from gpuwatch.signals.windows import CounterBank, EngineCounters, Window, histogram_quantile

INF = math.inf


def test_counter_bank_survives_a_reset():
    bank = CounterBank()
    bank.update({"g": {"q": 1000, "h": 500}})
    bank.update({"g": {"q": 2000, "h": 1000}})
    assert bank.update({"g": {"q": 100, "h": 90}}) is True  # restart: both start over
    assert bank.totals() == {"q": 2100, "h": 1090}
    bank.update({"g": {"q": 300, "h": 200}})
    assert bank.totals() == {"q": 2300, "h": 1200}
    assert bank.resets == 1


def test_a_reset_of_one_counter_resets_its_whole_group():
    bank = CounterBank()
    bank.update({"g": {"q": 1000, "h": 500}})
    # queries grew past their old value after the restart, hits did not: still a restart
    bank.update({"g": {"q": 1200, "h": 100}})
    assert bank.totals() == {"q": 2200, "h": 600}


def test_restart_flag_resets_even_when_counters_grew():
    bank = CounterBank()
    bank.update({"g": {"q": 1000}})
    bank.update({"g": {"q": 1500}}, restarted=True)
    assert bank.totals() == {"q": 2500}


def test_groups_reset_independently_and_gone_groups_keep_their_count():
    bank = CounterBank()
    bank.update({"e0": {"q": 100}, "e1": {"q": 200}})
    bank.update({"e0": {"q": 150}, "e1": {"q": 10}})  # engine core 1 restarted
    assert bank.totals() == {"q": 150 + 200 + 10}
    bank.update({"e0": {"q": 160}})  # core 1 is gone from the scrape
    assert bank.totals() == {"q": 160 + 210}


def test_window_keeps_one_snapshot_before_its_start():
    w = Window(60)
    for t in range(0, 200, 10):
        w.push(float(t), {"q": float(t)})
    assert w.snaps[0][0] == 130.0  # newest at or before 190 - 60
    assert w.increase("q") == (60.0, 60.0)
    base = w.base(["q"])
    assert base is not None and base[0] == 130.0


def test_window_counter_that_appears_later_counts_from_its_first_snapshot():
    w = Window(300)
    w.push(0.0, {"a": 1.0})
    w.push(10.0, {"a": 2.0, "b": 50.0})
    w.push(20.0, {"a": 3.0, "b": 80.0})
    assert w.increase("b") == (30.0, 10.0)
    assert w.base(["a", "b"])[0] == 10.0
    assert w.increase("missing") is None


def test_window_clock_going_back_starts_over():
    w = Window(300)
    w.push(100.0, {"a": 1.0})
    w.push(110.0, {"a": 2.0})
    w.push(50.0, {"a": 3.0})
    assert len(w.snaps) == 1 and w.increase("a") is None


B = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, INF)


@pytest.mark.parametrize(("q", "counts", "expected"), [
    # worked by hand from the definition (rank = q * total, linear inside the bucket)
    (0.5, [3, 3, 3, 4, 4, 4, 4, 5, 6, 7, 7], 0.9),
    (0.95, [3, 3, 3, 4, 4, 4, 4, 5, 6, 7, 7], 13.25),
    (0.25, [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4], 0.075),
    (0.99, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10], 15.0),  # in +Inf: the last finite bound
    (0.5, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], None),   # no observations: NaN in PromQL
])
def test_histogram_quantile_by_hand(q, counts, expected):
    got = histogram_quantile(q, B, [float(x) for x in counts])
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_histogram_quantile_edges():
    assert histogram_quantile(0.5, (1.0, 2.0), [1.0, 2.0]) is None  # no +Inf bucket
    assert histogram_quantile(0.5, (INF,), [3.0]) is None  # fewer than two buckets
    assert histogram_quantile(1.5, B, [1.0] * 11) == INF
    assert histogram_quantile(-1, B, [1.0] * 11) == -INF
    # a zero first bound (SGLang's queue_time_seconds) returns the bound itself
    assert histogram_quantile(0.1, (0.0, 0.1, INF), [5.0, 8.0, 10.0]) == 0.0
    # non-monotonic counts are forced monotonic, as Prometheus does
    assert histogram_quantile(0.5, (1.0, 2.0, INF), [4.0, 3.0, 8.0]) == pytest.approx(1.0)


def _prom_round(v: float) -> float:
    return math.floor(v * 1000 + 0.5) / 1000


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_histogram_quantile_matches_prometheus(tmp_path):
    """Random histograms through real Prometheus (promtool) and through ours: same values."""
    rng = random.Random(7)
    bounds = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0]
    series, tests = [], []
    for i in range(12):
        counts, total = [], 0
        for _ in [*bounds, INF]:
            total += rng.choice([0, 0, 1, 2, 5, 13])
            counts.append(total)
        if total == 0:
            continue
        for b, n in zip([*bounds, INF], counts, strict=True):
            le = "+Inf" if math.isinf(b) else repr(b)
            series.append(f"      - series: 'h_bucket{{case=\"{i}\",le=\"{le}\"}}'\n"
                          f"        values: '{n}'")
        for q in (0.5, 0.9, 0.95, 0.99):
            ours = histogram_quantile(q, (*bounds, INF), [float(x) for x in counts])
            tests.append(
                f"      - expr: round(histogram_quantile({q}, h_bucket{{case=\"{i}\"}}), 0.001)\n"
                f"        eval_time: 0m\n"
                f"        exp_samples:\n"
                f"          - labels: '{{case=\"{i}\"}}'\n"
                f"            value: {_prom_round(ours)!r}")
    spec = ("tests:\n  - interval: 1m\n    input_series:\n" + "\n".join(series) +
            "\n    promql_expr_test:\n" + "\n".join(tests) + "\n")
    path = tmp_path / "quantiles_test.yml"
    path.write_text(spec)
    out = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_groups_not_seen_for_n_scrapes_are_forgotten_but_their_count_is_kept():
    bank = CounterBank(expire_after=3)
    bank.update({"e0": {"q": 100}, "e1": {"q": 200}})
    for k in range(1, 4):
        bank.update({"e0": {"q": 100 + k}})
    assert set(bank.last) == {"e0"} and set(bank.offset) <= {"e0"}
    assert bank.totals() == {"q": 103 + 200}  # still monotonic
    bank.update({"e0": {"q": 110}})
    assert bank.totals() == {"q": 110 + 200}


def test_the_number_of_groups_is_capped_and_the_refusal_counted():
    bank = CounterBank(max_groups=10)
    bank.update({f"engine={i}": {"q": 1.0} for i in range(1000)})
    assert len(bank.last) == 10 and bank.refused == 990
    # known groups keep being counted while new ones are refused
    bank.update({"engine=0": {"q": 5.0}, "new": {"q": 1.0}})
    assert bank.refused == 1 and bank.totals() == {"q": 5.0 + 9}


def test_churning_label_values_keep_the_bank_bounded():
    bank = CounterBank(max_groups=64, expire_after=5)
    for scrape in range(200):
        bank.update({f"engine={scrape}-{i}": {"q": float(i)} for i in range(1000)})
        assert len(bank.last) <= 64 and len(bank.offset) <= 64 and len(bank.seen) <= 64
    assert len(bank.retired) == 1


def test_a_restart_is_a_new_process_whose_counts_add_to_the_old_ones():
    c = EngineCounters()
    assert c.update(1000.0, {"g": {"q": 500}}) == 0
    assert c.update(1000.0, {"g": {"q": 700}}) == 0
    assert c.update(2000.0, {"g": {"q": 50}}) == 1  # new start time
    assert c.totals() == {"q": 750} and c.replicas() == 1


def test_replicas_alternating_behind_one_url_are_not_restarts():
    c = EngineCounters()
    restarts = 0
    for k in range(40):  # two processes answer in turn, counters constant
        start, q = (1000.0, 500.0) if k % 2 == 0 else (3000.0, 80.0)
        restarts += c.update(start, {"g": {"q": q}})
        assert c.totals() == {"q": 500.0 + (80.0 if k else 0.0)}
    assert restarts == 0 and c.replicas() == 2
    # each replica counts on: the sum grows by what they counted, nothing more
    c.update(1000.0, {"g": {"q": 510.0}})
    c.update(3000.0, {"g": {"q": 85.0}})
    assert c.totals() == {"q": 595.0}


def test_processes_are_bounded_and_forgotten_ones_keep_their_count():
    c = EngineCounters(max_processes=4)
    for k in range(100):  # a restart at every scrape
        c.update(float(k), {"g": {"q": 1.0}})
        assert len(c.banks) <= 4
    assert c.totals() == {"q": 100.0}


@pytest.mark.parametrize("bounds,counts", [
    ((-10.0, -5.0, INF), [10.0, 10.0, 10.0]),  # every observation at or below -10
    ((-10.0, 1.0, INF), [5.0, 10.0, 10.0]),
    ((0.5, 1.0, INF), [0.0, 0.0, 10.0]),
    ((-10.0, -5.0, INF), [0.0, 0.0, 10.0]),  # all in +Inf above a negative last bound
])
def test_quantiles_are_never_negative_and_capped_at_the_last_finite_bound(bounds, counts):
    for q in (0.01, 0.5, 0.95, 0.99):
        v = histogram_quantile(q, bounds, counts)
        assert v is not None and 0.0 <= v <= max(bounds[-2], 0.0)


def test_folded_totals_keep_counting_known_names_at_their_cap():
    from gpuwatch.signals import windows

    bank = CounterBank(expire_after=1)
    bank.retired = {f"queue_le:{i}": 1.0 for i in range(windows.MAX_RETIRED_NAMES - 1)}
    bank.retired["q"] = 5.0
    bank.update({"g": {"q": 10.0, "new": 1.0}})
    bank.update({})  # g is forgotten: its total folds in
    assert bank.retired["q"] == 15.0 and "new" not in bank.retired
    assert len(bank.retired) == windows.MAX_RETIRED_NAMES
