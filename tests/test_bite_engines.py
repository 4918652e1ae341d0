"""Engine signal edges that a small change to the code must not get past: the hit-ratio
clamp, the SLO boundary and its traffic minimum, out-of-range KV usage."""

from __future__ import annotations

import math

import pytest

from gpuwatch.exposition import read
from gpuwatch.signals.config import KvCacheSignalConfig, QueueSignalConfig
from tests.test_engine_analyzer import Run, config, vllm_text


def test_hit_ratio_is_clamped_to_one_when_hits_outrun_queries():
    run = Run(config(kv=KvCacheSignalConfig(floor=0.5, min_queries=1)))
    run.scrape(0.0, vllm_text(1000, 0))
    run.scrape(10.0, vllm_text(2000, 1500))  # 1500 hits for 1000 queries: a skewed scrape
    st = run.state()
    assert st.kv_cache_hit_ratio == 1.0
    assert st.kv_cache_queries_in_window == 1000
    assert run.events == []


def test_hit_ratio_floor_is_strict_and_min_queries_inclusive():
    # 600 hits of 1000 queries: exactly at a 0.6 floor (no event), just under it (event).
    for floor, fires in ((0.6, False), (math.nextafter(0.6, 1), True)):
        run = Run(config(kv=KvCacheSignalConfig(floor=floor, min_queries=1000)))
        run.scrape(0.0, vllm_text(1000, 0))
        run.scrape(10.0, vllm_text(2000, 600))
        assert run.state().kv_cache_hit_ratio == pytest.approx(0.6)
        assert bool(run.events) is fires, floor
    # 999 queries in the window: too little traffic to judge, whatever the ratio.
    run = Run(config(kv=KvCacheSignalConfig(floor=0.9, min_queries=1000)))
    run.scrape(0.0, vllm_text(1000, 0))
    run.scrape(10.0, vllm_text(1999, 0))
    assert run.state().kv_cache_hit_ratio == 0.0 and run.events == []


def _queue_run(slo: float, min_requests: float, n: int = 20) -> Run:
    run = Run(config(queue=QueueSignalConfig(slo_seconds=slo, min_requests=min_requests)))
    run.scrape(0.0, vllm_text(0, 0))
    # n requests, all in the (2, 5] bucket: p95 = 2 + 3 * 0.95 = 4.85 s
    run.scrape(10.0, vllm_text(0, 0, buckets=(0, 0, 0, n, n, n), qsum=4.0 * n))
    return run


def test_slo_boundary_is_strict():
    p95 = _queue_run(100.0, 1).state().queue_latency_seconds["0.95"]
    assert p95 == pytest.approx(4.85)
    assert _queue_run(p95, 1).events == []
    fired = _queue_run(math.nextafter(p95, 0), 1).events
    assert [(e.signal, e.severity, e.value) for e in fired] == [
        ("queue_latency", "warning", p95)]


def test_slo_min_requests_is_inclusive():
    assert _queue_run(1.0, 20, n=20).events  # exactly min_requests: judged
    assert _queue_run(1.0, 20, n=19).events == []


@pytest.mark.parametrize(("usage", "expected"), [
    ("1.0", 1.0), ("1.0000001", 1.0), ("0", 0.0), ("1.3", None), ("-0.1", None),
    ("NaN", None), ("+Inf", None),
])
def test_kv_usage_out_of_range_is_invalid_not_clamped(usage, expected):
    text = vllm_text(0, 0).replace("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5",
                                   f"vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} "
                                   f"{usage}")
    reading, _ = read(text, "vllm")
    assert reading.kv_cache_usage_ratio == expected
    if expected is None:
        assert "invalid" in reading.missing["kv_cache_usage_ratio"]


def test_a_window_without_requests_gives_no_latency_and_says_so():
    run = Run(config(queue=QueueSignalConfig(slo_seconds=0.001, min_requests=0)))
    same = vllm_text(0, 0, buckets=(1, 2, 3, 4, 5, 5), qsum=9.0)
    run.scrape(0.0, same)
    run.scrape(10.0, same)
    st = run.state()
    assert st.queue_requests_in_window == 0
    assert st.queue_latency_seconds == {} and st.queue_latency_mean_seconds is None
    assert st.missing["queue_latency"].startswith("no request left the queue")
    assert st.missing["queue_latency_mean"].startswith("no request left the queue")
    assert run.events == []  # nothing to judge, even with min_requests = 0


def test_one_request_in_the_window():
    run = Run()
    run.scrape(0.0, vllm_text(0, 0, buckets=(1, 1, 1, 1, 1, 1), qsum=0.25))
    run.scrape(10.0, vllm_text(0, 0, buckets=(1, 1, 2, 2, 2, 2), qsum=1.75))
    st = run.state()
    # The one request took 1.5 s, in the (1, 2] bucket: p50 = 1 + 1 x 0.5
    assert st.queue_requests_in_window == 1 and st.queue_latency_mean_seconds == 1.5
    assert st.queue_latency_seconds["0.5"] == pytest.approx(1.5)
