"""EngineAnalyzer: scrapes in, derived.engines and events out (pure, replayable)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from gpuwatch.engines.config import DiscoveryConfig, EngineConfig
from gpuwatch.model import EngineSample, GpuSample, ProcessSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.config import KvCacheSignalConfig, QueueSignalConfig
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.engine import EngineAnalyzer

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
BOUNDS = (0.5, 1.0, 2.0, 5.0, 10.0)


def config(kv=None, queue=None, engines=(), discovery=None):
    return SimpleNamespace(
        engines=list(engines),
        discovery=discovery or DiscoveryConfig(),
        signals=SimpleNamespace(kv_cache=kv or KvCacheSignalConfig(),
                                queue=queue or QueueSignalConfig()),
    )


def vllm_text(q, h, *, running=1, waiting=0, usage=0.5, buckets=(0, 0, 0, 0, 0, 0),
              qsum=0.0, preempt=0, start=1000.0, engine="0"):
    """A vLLM V1 exposition with the given counter values (cumulative bucket counts)."""
    lab = f'engine="{engine}",model_name="m"'
    lines = [
        f"process_start_time_seconds {start}",
        f"vllm:num_requests_running{{{lab}}} {running}",
        f"vllm:num_requests_waiting{{{lab}}} {waiting}",
        f"vllm:kv_cache_usage_perc{{{lab}}} {usage}",
        f"vllm:prefix_cache_queries_total{{{lab}}} {q}",
        f"vllm:prefix_cache_hits_total{{{lab}}} {h}",
        f"vllm:num_preemptions_total{{{lab}}} {preempt}",
    ]
    for b, n in zip((*BOUNDS, "+Inf"), buckets, strict=True):
        lines.append(f'vllm:request_queue_time_seconds_bucket{{{lab},le="{b}"}} {n}')
    lines.append(f"vllm:request_queue_time_seconds_count{{{lab}}} {buckets[-1]}")
    lines.append(f"vllm:request_queue_time_seconds_sum{{{lab}}} {qsum}")
    return "\n".join(lines) + "\n"


class Run:
    """Feeds ticks to one analyzer and keeps every event."""

    def __init__(self, cfg=None):
        self.analyzer = EngineAnalyzer(cfg or config())
        self.derived = Derived()
        self.conditions = Conditions()
        self.events = []

    def tick(self, t, *samples, gpus=()):
        tick = Tick(t=t, engines=list(samples), gpus=list(gpus))
        evs = self.analyzer.update(tick, self.derived, self.conditions)
        self.events += evs
        return evs

    def scrape(self, t, text=None, error=None, name="e", kind="auto", pids=()):
        return self.tick(t, EngineSample(name=name, kind=kind, url="http://127.0.0.1:1/metrics",
                                         exposition=text, error=error, t=t, pids=list(pids)))

    def state(self, name="e"):
        return self.derived.engines[name]


def test_vllm_fixtures_give_the_windowed_signals():
    run = Run()
    run.scrape(100.0, (FIXTURES / "vllm-0.33.0-statlogger.prom").read_text())
    st = run.state()
    assert st.up and st.kind == "vllm" and st.generation == "v1"
    assert st.kv_cache_hit_ratio is None and "second scrape" in st.missing["kv_cache_hit_ratio"]
    run.scrape(130.0, (FIXTURES / "vllm-0.33.0-statlogger-later.prom").read_text())
    st = run.state()
    assert (st.requests_running, st.requests_waiting, st.kv_cache_usage_ratio) == (4, 2, 0.57)
    assert (st.prefix_cache_queries_total, st.prefix_cache_hits_total) == (2436, 1638)
    assert st.kv_cache_hit_ratio == pytest.approx((1638 - 640) / (2436 - 1000))
    assert st.kv_cache_hit_ratio_source == "window"
    # 7 requests left the queue between the scrapes; quantiles worked by hand
    assert st.queue_requests_in_window == 7
    assert st.queue_latency_seconds["0.5"] == pytest.approx(0.9)
    assert st.queue_latency_seconds["0.95"] == pytest.approx(13.25)
    assert st.queue_latency_seconds["0.99"] == pytest.approx(14.65)
    assert st.queue_latency_mean_seconds == pytest.approx((31.97 - 9.03) / 7, abs=1e-3)
    assert st.preemptions_total == 1 and st.preemption_rate_per_second == 0
    assert st.cache_config["num_gpu_blocks"] == "27000"
    assert run.events == []


@pytest.mark.parametrize(("first", "later", "ratio", "p50", "mean"), [
    # V1 <= 0.8, two data-parallel cores: (350-100 + 450-200) / (900-400 + 1100-600)
    ("vllm-0.8-v1-dp2.prom", "vllm-0.8-v1-dp2-later.prom", 500 / 1000, None, 17.6 / 4),
    ("sglang.prom", "sglang-later.prom", 12000 / 30000, None, (24.4 - 4.6) / 10),
    # a real llama-server under load, then after it: cached / (processed + cached) prompt
    ("llamacpp-0.3.36-real-load.prom", "llamacpp-0.3.36-real-after.prom",
     (252 - 72) / (48 + 252 - 28 - 72), None, None),
    ("tgi.prom", "tgi-later.prom", None, None, (54.83 - 3.54) / 20),
    ("triton-trtllm.prom", "triton-trtllm-later.prom", None, None, 6.0 / 60),
])
def test_every_engine_gives_the_same_normalized_signals(first, later, ratio, p50, mean):
    run = Run()
    run.scrape(0.0, (FIXTURES / first).read_text())
    run.scrape(30.0, (FIXTURES / later).read_text())
    st = run.state()
    assert st.up
    assert st.requests_waiting is not None
    if ratio is None:
        assert st.kv_cache_hit_ratio is None and "kv_cache_hit_ratio" in st.missing
    else:
        assert st.kv_cache_hit_ratio == pytest.approx(ratio)
    if mean is None:
        assert st.queue_latency_mean_seconds is None
    else:
        assert st.queue_latency_mean_seconds == pytest.approx(mean)
    if st.kind == "triton":
        assert st.queue_latency_seconds == {} and "histogram" in st.missing["queue_latency"]


def test_sglang_and_tgi_quantiles_by_hand():
    run = Run()
    run.scrape(0.0, (FIXTURES / "sglang.prom").read_text())
    run.scrape(30.0, (FIXTURES / "sglang-later.prom").read_text())
    # window: 4 x 0.05 s, 2 x 0.3 s, 2 x 1.5 s, 2 x 8 s. p50: rank 5 in (0.2, 0.5]
    # holding 2 after 4 below: 0.2 + 0.3 * (1 / 2)
    assert run.state().queue_latency_seconds["0.5"] == pytest.approx(0.35)
    run = Run()
    run.scrape(0.0, (FIXTURES / "tgi.prom").read_text())
    run.scrape(30.0, (FIXTURES / "tgi-later.prom").read_text())
    q = run.state().queue_latency_seconds
    # window: 5 x 2 ms, 4 x 20 ms, 4 x 0.3 s, 2 x 2.5 s, 5 x 9 s -> p99 inside the bucket
    # that holds 9 s, p50 inside the one holding 0.3 s
    assert 0.2 < q["0.5"] < 0.41 and 6.5 < q["0.99"] < 14.8


def test_engine_restart_with_counter_reset():
    run = Run()
    run.scrape(0.0, vllm_text(1000, 500, buckets=(1, 2, 2, 2, 2, 2), qsum=1.0))
    run.scrape(10.0, vllm_text(2000, 1000, buckets=(2, 4, 4, 4, 4, 4), qsum=2.0))
    # restart: new process, counters from zero
    run.scrape(20.0, vllm_text(100, 90, buckets=(0, 0, 1, 1, 1, 1), qsum=1.5, start=2000.0))
    st = run.state()
    assert st.restarts_detected == 1
    # exported counters never go down: old count kept as an offset
    assert (st.prefix_cache_queries_total, st.prefix_cache_hits_total) == (2100, 1090)
    # window from t=0: (1000 + 100) queries, (500 + 90) hits
    assert st.kv_cache_hit_ratio == pytest.approx(590 / 1100)
    # 2 requests between t=0 and t=10, then 1 after the restart
    assert st.queue_requests_in_window == 3
    assert st.queue_latency_mean_seconds == pytest.approx((1.0 + 1.5) / 3)


def test_restart_seen_by_start_time_even_when_counters_grew():
    run = Run()
    run.scrape(0.0, vllm_text(1000, 500))
    run.scrape(10.0, vllm_text(1500, 700, start=5000.0))  # new process, already busier
    st = run.state()
    assert st.restarts_detected == 1 and st.prefix_cache_queries_total == 2500
    assert st.kv_cache_hit_ratio == pytest.approx(700 / 1500)


def test_engine_down_fires_after_the_configured_failures_and_resolves():
    cfg = config(engines=[EngineConfig(name="e", url="http://127.0.0.1:1/metrics",
                                       down_after_failures=2)])
    run = Run(cfg)
    run.scrape(0.0, vllm_text(10, 5))
    assert run.scrape(5.0, error="connection failed: refused") == []
    st = run.state()
    assert not st.up and st.reason == "connection failed: refused"
    # nothing is reported as 0 while down: every normalized value is absent, and says why
    assert st.requests_running is None and st.kv_cache_usage_ratio is None
    assert st.prefix_cache_queries_total is None and st.missing["requests_running"] == "engine down"
    evs = run.scrape(10.0, error="no complete response within 2s")
    assert [(e.signal, e.state, e.severity, e.engine) for e in evs] == [
        ("engine_down", "firing", "critical", "e")]
    assert "no complete response" in evs[0].message
    assert run.scrape(15.0, error="HTTP 500 Internal Server Error") == []  # still down: no repeat
    evs = run.scrape(20.0, vllm_text(20, 10))
    assert [(e.signal, e.state) for e in evs] == [("engine_down", "resolved")]
    assert run.state().up and run.state().prefix_cache_queries_total == 20


def test_garbage_and_unknown_expositions_mark_the_engine_down():
    run = Run()
    run.scrape(0.0, "\x89PNG\r\n\x1a\n\x00\x00garbage")
    assert not run.state().up and "binary" in run.state().reason
    run.scrape(5.0, "<html>oops</html>", kind="vllm")
    assert "no vllm metrics" in run.state().reason
    assert run.state().kind == "vllm"  # the configured kind labels the down engine


def test_kv_hit_ratio_floor_event():
    cfg = config(kv=KvCacheSignalConfig(window_seconds=60, floor=0.5, critical_floor=0.2,
                                        min_queries=100))
    run = Run(cfg)
    run.scrape(0.0, vllm_text(0, 0))
    assert run.scrape(10.0, vllm_text(50, 5)) == []  # too few queries to judge
    evs = run.scrape(20.0, vllm_text(1000, 300))  # 300 / 1000 over the window
    assert [(e.signal, e.state, e.severity) for e in evs] == [
        ("kv_cache_hit_ratio", "firing", "warning")]
    assert evs[0].value == pytest.approx(0.3) and evs[0].threshold == 0.5
    evs = run.scrape(30.0, vllm_text(3000, 400))  # 400 / 3000: critical
    assert [(e.state, e.severity) for e in evs] == [("firing", "critical")]
    # a minute of good hits slides the bad ones out of the window: 6600 / 7000
    evs = run.scrape(90.0, vllm_text(10000, 7000))
    assert [(e.signal, e.state) for e in evs] == [("kv_cache_hit_ratio", "resolved")]
    assert run.state().kv_cache_hit_ratio == pytest.approx(6600 / 7000)


def test_kv_floor_off_by_default_never_fires():
    run = Run()
    run.scrape(0.0, vllm_text(0, 0))
    assert run.scrape(10.0, vllm_text(100000, 0)) == []
    assert run.state().kv_cache_hit_ratio == 0.0


def test_queue_latency_slo_event_and_resolution():
    cfg = config(queue=QueueSignalConfig(window_seconds=60, slo_seconds=2.0,
                                         critical_seconds=9.0, min_requests=5))
    run = Run(cfg)
    run.scrape(0.0, vllm_text(0, 0, buckets=(0, 0, 0, 0, 0, 0)))
    # 10 requests: 8 within 0.5 s, 2 in (5, 10]: rank 9.5 is 1.5 into that bucket of 2,
    # p95 = 5 + 5 * 1.5 / 2 = 8.75 s > 2
    evs = run.scrape(10.0, vllm_text(0, 0, buckets=(8, 8, 8, 8, 10, 10), qsum=16))
    assert [(e.signal, e.state, e.severity) for e in evs] == [
        ("queue_latency", "firing", "warning")]
    assert evs[0].value == pytest.approx(8.75) and "p95" in evs[0].message
    # 10 more slow ones beyond 10 s: p95 in +Inf -> 10 s (last finite bound) > 9: critical
    evs = run.scrape(20.0, vllm_text(0, 0, buckets=(8, 8, 8, 8, 10, 20), qsum=200))
    assert [(e.state, e.severity) for e in evs] == [("firing", "critical")]
    # a quiet minute later the window is empty: nothing to judge, the condition resolves
    evs = run.scrape(80.0, vllm_text(0, 0, buckets=(8, 8, 8, 8, 10, 20), qsum=200))
    assert [(e.signal, e.state) for e in evs] == [("queue_latency", "resolved")]
    assert "no request left the queue" in run.state().missing["queue_latency"]


def test_triton_mean_is_judged_without_a_histogram():
    cfg = config(queue=QueueSignalConfig(slo_seconds=0.05, min_requests=10))
    run = Run(cfg)
    run.scrape(0.0, (FIXTURES / "triton-trtllm.prom").read_text())
    evs = run.scrape(60.0, (FIXTURES / "triton-trtllm-later.prom").read_text())
    assert [(e.signal, e.state) for e in evs] == [("queue_latency", "firing")]
    assert evs[0].value == pytest.approx(0.1) and "mean queue time" in evs[0].message


def test_engines_link_to_gpus_through_nvml_pids():
    run = Run()
    gpus = [GpuSample(index=0, uuid="GPU-a", processes=[ProcessSample(pid=4242)]),
            GpuSample(index=1, uuid="GPU-b", processes=[ProcessSample(pid=4243)]),
            GpuSample(index=2, uuid="GPU-c", processes=[ProcessSample(pid=99)])]
    sample = EngineSample(name="e", url="u", exposition=vllm_text(1, 1), t=1.0,
                          pids=[4240, 4242, 4243])
    run.tick(1.0, sample, gpus=gpus)
    assert run.state().gpus == {"GPU-a": 0, "GPU-b": 1}
    assert run.state().pids == [4240, 4242, 4243]


def test_silent_engines_are_forgotten_and_their_events_resolve():
    cfg = config(discovery=DiscoveryConfig(forget_after_seconds=60, down_after_failures=1))
    run = Run(cfg)
    run.scrape(0.0, error="refused", name="gone")
    assert [e.signal for e in run.events] == ["engine_down"]
    run.scrape(30.0, vllm_text(1, 1), name="other")
    assert "gone" in run.derived.engines
    evs = run.scrape(70.0, vllm_text(2, 1), name="other")
    assert "gone" not in run.derived.engines
    assert [(e.signal, e.state, e.engine) for e in evs] == [("engine_down", "resolved", "gone")]


def test_replay_gives_the_same_states_and_events():
    ticks = []
    texts = [vllm_text(i * 100, i * 30, buckets=(i, i, 2 * i, 2 * i, 3 * i, 3 * i),
                       qsum=i * 2.5, start=1000.0 if i < 6 else 2000.0) for i in range(10)]
    for i, text in enumerate(texts):
        err = "timeout" if i in (3, 4) else None
        ticks.append(Tick(t=float(i * 5), engines=[EngineSample(
            name="e", url="u", exposition=None if err else text, error=err, t=i * 5.0)]))
    cfg = config(kv=KvCacheSignalConfig(floor=0.5, min_queries=1),
                 queue=QueueSignalConfig(slo_seconds=0.5, min_requests=1))
    outs = []
    for _ in range(2):
        run = Run(cfg)
        for tick in ticks:
            run.tick(tick.t, *tick.engines)
        outs.append((msgspec.to_builtins(run.events), msgspec.to_builtins(run.derived.engines)))
    assert outs[0] == outs[1]
    assert {e["signal"] for e in outs[0][0]} >= {"engine_down", "kv_cache_hit_ratio"}


def test_values_are_never_nan_or_negative_after_hostile_counters():
    run = Run()
    run.scrape(0.0, vllm_text(1e308, 1e308))
    run.scrape(5.0, vllm_text(1e308, 1e308))
    run.scrape(10.0, vllm_text("NaN", "-5", usage="+Inf"))
    st = run.state()
    for v in (st.kv_cache_hit_ratio, st.kv_cache_usage_ratio, st.prefix_cache_queries_total):
        assert v is None or (math.isfinite(v) and v >= 0)


def test_a_counter_above_2_to_the_53_is_an_invalid_sample_and_the_engine_recovers():
    run = Run()
    run.scrape(0.0, vllm_text(1000, 500, preempt=3))
    run.scrape(5.0, vllm_text(1e308, 1e308, preempt=1e308, running=1e308))
    st = run.state()
    assert st.up and st.requests_running is None and st.prefix_cache_queries_total is None
    assert any("2^53" in n for n in st.notes)
    run.scrape(10.0, vllm_text(1100, 560, preempt=4))
    run.scrape(15.0, vllm_text(1200, 620, preempt=5))
    st = run.state()
    assert st.restarts_detected == 0
    assert (st.prefix_cache_queries_total, st.prefix_cache_hits_total) == (1200, 620)
    assert st.preemptions_total == 5 and st.requests_running == 1
    assert st.kv_cache_hit_ratio == pytest.approx(120 / 200)


def test_two_replicas_behind_one_url_are_reported_not_turned_into_restarts():
    run = Run()
    for k in range(80):  # longer than the 300 s windows
        start, q, p = (1000.0, 5000, 40) if k % 2 == 0 else (7000.0, 300, 2)
        run.scrape(5.0 * k, vllm_text(q, q // 2, preempt=p, start=start))
    st = run.state()
    assert st.up and st.replicas == 2 and "2 processes answer" in st.reason
    assert st.restarts_detected == 0
    assert st.preemptions_total == 42 and st.prefix_cache_queries_total == 5300
    assert st.preemption_rate_per_second == 0.0
    assert st.kv_cache_hit_ratio is None  # no query in the window: not a fabricated one


def test_a_real_restart_is_still_counted_once():
    run = Run()
    for k in range(10):
        start = 1000.0 if k < 5 else 2000.0
        run.scrape(5.0 * k, vllm_text(100 * (k % 5 + 1), 10, start=start))
    st = run.state()
    assert st.restarts_detected == 1 and st.replicas == 1 and st.reason == ""
    assert st.prefix_cache_queries_total == 500 + 500


@pytest.mark.parametrize("bounds,expect", [
    (("-30", "-10", "+Inf"), 0.0),  # a negative bucket: never a negative queue time
    (("1", "1e300", "+Inf"), None),  # a bound of 1e300 s: not a sane quantile, not judged
])
def test_absurd_bucket_bounds_give_no_absurd_quantile_and_no_event(bounds, expect):
    cfg = config(queue=QueueSignalConfig(window_seconds=60, slo_seconds=2.0, min_requests=1))
    run = Run(cfg)
    lab = 'engine="0",model_name="m"'

    def text(n):
        counts = (0, n, n) if expect is None else (n, n, n)
        lines = [f"vllm:num_requests_running{{{lab}}} 1"]
        lines += [f'vllm:request_queue_time_seconds_bucket{{{lab},le="{b}"}} {c}'
                  for b, c in zip(bounds, counts, strict=True)]
        lines += [f"vllm:request_queue_time_seconds_count{{{lab}}} {n}",
                  f"vllm:request_queue_time_seconds_sum{{{lab}}} {n * 9.5e299}"]
        return "\n".join(lines) + "\n"

    run.scrape(0.0, text(0))
    run.scrape(10.0, text(100))
    st = run.state()
    assert st.up
    for v in st.queue_latency_seconds.values():
        assert 0.0 <= v <= 86400
    if expect is None:
        assert st.queue_latency_seconds == {} and "beyond" in st.missing["queue_latency"]
    else:
        assert st.queue_latency_seconds["0.95"] == expect
    assert st.queue_latency_mean_seconds is None  # 9.5e299 s per request: not believed
    assert not [e for e in run.events if e.signal == "queue_latency"]
