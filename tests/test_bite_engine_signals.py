"""Engine analyzer edges an operator relies on, each one a small slip in the code would move:
rates over the engine's own scrape times, a day as the longest believable queue time,
critical limits and the traffic a ratio needs, the forgetting horizon, what a down engine
still reports, bounded reasons and notes, the cap on series groups, and the windows and
counter banks under all of it."""

from __future__ import annotations

import math

import pytest

from gpuwatch.engines.config import DiscoveryConfig, EngineConfig
from gpuwatch.exposition import common as c
from gpuwatch.exposition import read
from gpuwatch.model import EngineSample
from gpuwatch.signals.config import KvCacheSignalConfig, QueueSignalConfig
from gpuwatch.signals.windows import EngineCounters, Window
from tests.test_engine_analyzer import Run, config, vllm_text


@pytest.mark.parametrize(("seconds", "before", "after", "rate"), [
    (10.0, 10, 40, 3.0),
    (1.0, 0, 5, 5.0),  # scrapes one second apart still give a rate
])
def test_preemption_rate_is_the_increase_over_the_seconds_between_scrapes(
        seconds, before, after, rate):
    run = Run()
    run.scrape(0.0, vllm_text(0, 0, preempt=before))
    run.scrape(seconds, vllm_text(0, 0, preempt=after))
    assert run.state().preemption_rate_per_second == rate


def test_windows_run_on_the_engine_scrape_time_not_the_tick_time():
    # The scrape finished 4 s before the tick that carries it: the rate is per scrape second.
    run = Run()
    for tick_t, scrape_t, preempt in ((10.0, 6.0, 0), (20.0, 16.0, 50)):
        run.tick(tick_t, EngineSample(name="e", url="u", t=scrape_t,
                                      exposition=vllm_text(0, 0, preempt=preempt)))
    st = run.state()
    assert st.last_scrape == 16.0
    assert st.preemption_rate_per_second == 5.0
    # A sample without its own time (an older recording) is placed at the tick's.
    run.tick(30.0, EngineSample(name="e", url="u", exposition=vllm_text(0, 0, preempt=50)))
    assert run.state().last_scrape == 30.0
    # Nor is a time that is not a number believed.
    run.tick(40.0, EngineSample(name="e", url="u", t=math.nan,
                                exposition=vllm_text(0, 0, preempt=50)))
    assert run.state().last_scrape == 40.0


def _histogram_text(bound: float, n: int = 100, start: float = 1000.0) -> str:
    """vLLM queue-time histogram: n - 1 requests within `bound` (above 1 s), one beyond it,
    so that p99 is `bound` exactly."""
    lab = 'engine="0",model_name="m"'
    rows = [(1.0, 0), (bound, n - 1 if n else 0), ("+Inf", n)]
    lines = [f"process_start_time_seconds {start}",
             f"vllm:num_requests_running{{{lab}}} 0",
             f"vllm:num_requests_waiting{{{lab}}} 0"]
    lines += [f'vllm:request_queue_time_seconds_bucket{{{lab},le="{b}"}} {c}' for b, c in rows]
    lines += [f"vllm:request_queue_time_seconds_count{{{lab}}} {n}",
              f"vllm:request_queue_time_seconds_sum{{{lab}}} 0"]
    return "\n".join(lines) + "\n"


def _p99(bound: float):
    run = Run(config(queue=QueueSignalConfig(quantiles=[0.99], slo_quantile=0.99,
                                             slo_seconds=1.0, min_requests=1)))
    run.scrape(0.0, _histogram_text(bound, n=0))
    run.scrape(10.0, _histogram_text(bound))
    return run


def test_a_queue_time_of_one_day_is_believed_and_more_is_not():
    run = _p99(86400.0)
    st = run.state()
    assert st.queue_latency_seconds == {"0.99": 86400.0}
    assert st.queue_requests_in_window == 100  # the one beyond every bound counts too
    assert [(e.signal, e.value, e.message) for e in run.events] == [(
        "queue_latency", 86400.0,
        "engine e: p99 queue time 8.64e+04s over the last 300s exceeds 1s")]
    run = _p99(math.nextafter(86400.0, math.inf))
    st = run.state()
    assert st.queue_latency_seconds == {}
    assert st.missing["queue_latency"] == (
        "p99 of 8.64e+04s is beyond 86400s: the bucket bounds are not sane")
    assert run.events == []  # nothing fires on a value gpuwatch does not believe


def test_an_engine_silent_for_exactly_the_horizon_is_kept_and_then_forgotten():
    run = Run(config(discovery=DiscoveryConfig(forget_after_seconds=60, down_after_failures=1)))
    run.scrape(0.0, vllm_text(1, 1), name="gone")
    run.scrape(60.0, error="refused", name="other")
    assert "gone" in run.derived.engines
    evs = run.scrape(60.5, error="refused", name="other")
    assert "gone" not in run.derived.engines
    # Forgetting one engine leaves the others' conditions alone.
    assert evs == [] and [e.engine for e in run.conditions.active.values()] == ["other"]


def test_requests_beyond_every_bucket_bound_give_the_highest_finite_bound():
    run = Run()
    run.scrape(0.0, vllm_text(0, 0))
    run.scrape(10.0, vllm_text(0, 0, buckets=(0, 0, 0, 0, 0, 5), qsum=500.0))
    st = run.state()
    assert st.queue_requests_in_window == 5
    assert st.queue_latency_seconds == {"0.5": 10.0, "0.95": 10.0, "0.99": 10.0}


def test_a_down_engine_keeps_its_kind_and_answers_with_no_process():
    run = Run()
    run.scrape(0.0, vllm_text(1, 1))
    assert (run.state().kind, run.state().replicas) == ("vllm", 1)
    run.scrape(5.0, error="connection refused")
    st = run.state()
    assert not st.up
    assert st.kind == "vllm"  # the engine's series keep their labels while it is down
    assert st.replicas == 0
    # Never read: a configured kind is shown, "auto" is not a kind.
    run.scrape(0.0, error="connection refused", name="new", kind="auto")
    assert run.state("new").kind == ""
    run.scrape(0.0, error="connection refused", name="sg", kind="sglang")
    assert run.state("sg").kind == "sglang"


def test_the_down_reason_keeps_the_first_500_characters_of_a_hostile_error():
    run = Run()
    run.scrape(0.0, error="x" * 499 + "y" + "z" * 5000)
    assert run.state().reason == "x" * 499 + "y"


def test_an_invalid_hit_counter_gives_no_hit_ratio_and_no_wait_for_a_second_scrape():
    # Queries are sane, every hit sample is NaN: the ratio cannot be had from this engine,
    # however many scrapes come.
    run = Run()
    for t, q in ((0.0, 100), (10.0, 200), (20.0, 300)):
        run.scrape(t, vllm_text(q, "NaN"))
    st = run.state()
    assert st.prefix_cache_queries_total == 300 and st.prefix_cache_hits_total is None
    assert st.kv_cache_hit_ratio is None
    assert "second scrape" not in st.missing["kv_cache_hit_ratio"]


def test_series_groups_beyond_the_cap_are_counted_in_the_limit_message():
    text = "".join(vllm_text(1, 1, engine=str(k)) for k in range(5))
    run = Run(config(engines=[EngineConfig(name="e", url="http://127.0.0.1:1/metrics",
                                           max_series_groups=2)]))
    run.scrape(0.0, text)
    st = run.state()
    assert st.up and st.series_groups == 2
    assert st.limit.startswith("3 series group(s) of this scrape refused")


def test_hit_ratio_exactly_at_the_critical_floor_is_a_warning():
    # 300 hits of 1000 queries: 0.3, at a 0.3 critical floor and under a 0.6 floor.
    def severities(critical_floor):
        run = Run(config(kv=KvCacheSignalConfig(floor=0.6, critical_floor=critical_floor,
                                                min_queries=1)))
        run.scrape(0.0, vllm_text(1000, 0))
        run.scrape(10.0, vllm_text(2000, 300))
        return [(e.severity, e.threshold) for e in run.events]

    assert severities(0.3) == [("warning", 0.6)]
    assert severities(math.nextafter(0.3, 1)) == [("critical", math.nextafter(0.3, 1))]


def test_queue_time_exactly_at_the_critical_limit_is_a_warning():
    # 20 requests in the (2, 5] bucket: p95 is 4.85 s, over a 1 s SLO.
    def severities(critical):
        run = Run(config(queue=QueueSignalConfig(slo_seconds=1.0, critical_seconds=critical,
                                                 min_requests=1)))
        run.scrape(0.0, vllm_text(0, 0))
        run.scrape(10.0, vllm_text(0, 0, buckets=(0, 0, 0, 20, 20, 20), qsum=80.0))
        return [(e.severity, e.threshold) for e in run.events]

    p95 = 2 + 3 * 0.95
    assert severities(p95) == [("warning", 1.0)]
    assert severities(math.nextafter(p95, 0)) == [("critical", math.nextafter(p95, 0))]


def test_one_query_in_the_window_is_enough_for_a_ratio_and_none_is_not():
    # Reporting the ratio needs one query; judging it waits for min_queries.
    run = Run()
    run.scrape(0.0, vllm_text(1000, 500))
    run.scrape(10.0, vllm_text(1001, 501))
    st = run.state()
    assert (st.kv_cache_hit_ratio, st.kv_cache_queries_in_window) == (1.0, 1.0)
    run.scrape(20.0, vllm_text(1001, 501))
    run.scrape(400.0, vllm_text(1001, 501))  # the window has slid past the last query
    st = run.state()
    assert st.kv_cache_hit_ratio is None
    assert st.missing["kv_cache_hit_ratio"] == "no prefix-cache queries in the last 300s"


def test_sub_second_queue_times_give_their_own_mean():
    # 10 requests that queued 0.5 s in all: a mean of 50 ms, not rounded up to anything.
    run = Run()
    run.scrape(0.0, vllm_text(0, 0))
    run.scrape(10.0, vllm_text(0, 0, buckets=(10, 10, 10, 10, 10, 10), qsum=0.5))
    assert run.state().queue_latency_mean_seconds == 0.05


def test_an_engine_shows_at_most_20_notes_whatever_its_reading_carries():
    text = vllm_text(0, 0)
    reading, why = read(text, "vllm")
    reading.notes = [f"note {k}" for k in range(50)]
    sample = EngineSample(name="e", url="u", t=0.0, exposition=text)
    sample.reading = (reading, why)  # what the live source hands over, read off the loop
    run = Run()
    run.tick(0.0, sample)
    assert run.state().notes == [f"note {k}" for k in range(20)]


def test_a_scrape_recorded_twice_at_one_time_keeps_the_engine_up_without_a_rate():
    run = Run()
    run.scrape(0.0, vllm_text(0, 0, preempt=0))
    run.scrape(0.0, vllm_text(0, 0, preempt=5))  # no time between them: no rate to give
    st = run.state()
    assert st.up and st.preemptions_total == 5
    assert st.preemption_rate_per_second is None
    assert st.prefix_cache_unit == "tokens"


def test_one_failed_scrape_keeps_the_queue_verdict_and_engine_down_resolves_it():
    run = Run(config(queue=QueueSignalConfig(slo_seconds=1.0, min_requests=1)))
    run.scrape(0.0, vllm_text(0, 0))
    run.scrape(10.0, vllm_text(0, 0, buckets=(0, 0, 0, 20, 20, 20), qsum=80.0))
    assert [(e.signal, e.state) for e in run.events] == [("queue_latency", "firing")]
    assert run.scrape(15.0, error="timeout") == []  # one failure (down after 2): unchanged
    evs = run.scrape(20.0, error="timeout")
    assert [(e.signal, e.state) for e in evs] == [
        ("engine_down", "firing"), ("queue_latency", "resolved")]


def test_two_snapshots_at_one_time_span_no_seconds_and_give_no_increase():
    w = Window(300.0)
    w.push(10.0, {"q": 1.0, "h": 1.0})
    w.push(10.0, {"q": 5.0, "h": 2.0})
    assert w.increase("q") is None and w.base(["q", "h"]) is None
    w.push(12.0, {"q": 9.0, "h": 3.0})
    assert w.increase("q") == (8.0, 2.0) and w.base(["q", "h"])[0] == 10.0


def test_a_restarted_process_is_folded_after_exactly_expire_after_scrapes_without_it():
    bank = EngineCounters(expire_after=3)
    bank.update(100.0, {"g": {"q": 40.0}})
    for n in (1, 2, 3):
        bank.update(200.0, {"g": {"q": 5.0 * n}})  # restarted: counts from its own values
        assert bank.totals() == {"q": 40.0 + 5.0 * n}  # the old process's count is kept
        assert (100.0 in bank.banks) is (n < 3), n  # ... in its bank, then folded


def test_an_ambiguous_endpoint_names_why_for_each_signal_it_derives_nothing_for():
    """Two processes answering in turn at one URL, no start time to tell them apart: every
    windowed signal is missing, each with the same short reason (the head of the
    endpoint's own), and their resets are not counted as restarts."""
    run = Run()
    for i in range(12):
        text = vllm_text(0, 0, preempt=1000 if i % 2 else 10).splitlines()
        run.scrape(5.0 * i, "\n".join(x for x in text if "process_start_time" not in x))
    st = run.state()
    assert st.ambiguous and ":" in st.reason
    head = st.reason.split(":", 1)[0]
    assert "counters went backwards" in head
    for key in (c.PREFIX_CACHE, c.KV_HIT_RATIO, c.QUEUE_LATENCY, c.QUEUE_MEAN, c.PREEMPTION):
        assert st.missing[key] == f"ambiguous endpoint: {head}", key
    assert st.preemption_rate_per_second is None
    # the resets are no restarts: only the first, counted before the second showed the
    # flapping, stays counted
    assert st.restarts_total == 1
