"""Serving signals that tell the truth: one bucket layout with a bounded mapping error, quantiles
flagged below the engine's resolution, errors as clients were answered, one row per model,
restarts as a counter, and endpoints whose counters cannot be trusted."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from gpuwatch.exposition import layout, read
from gpuwatch.model import EngineSample, Tick
from gpuwatch.signals import slis
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.config import QueueSignalConfig, SignalsConfig
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.engine import EngineAnalyzer
from gpuwatch.signals.windows import histogram_quantile
from tests.test_engine_slis import exported

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
INF = math.inf


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


# -- the layout and its mapping ---------------------------------------------------------------

def test_the_layout_is_sorted_and_bounded():
    assert list(layout.BOUNDS) == sorted(set(layout.BOUNDS))
    assert layout.LE_LABELS[-1] == "+Inf" and len(layout.LE_LABELS) == len(layout.BOUNDS) + 1
    ratios = [b / a for a, b in zip(layout.BOUNDS, layout.BOUNDS[1:], strict=False)]
    assert max(ratios) <= 4.0  # the error bound is one of these buckets
    # the layouts engines share map exactly: vLLM's (and SGLang's) TTFT, ITL and E2E buckets
    for ours in ((0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0), (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                    0.75, 1.0, 2.5),
                 (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480,
                  960, 1920, 7680)):
        assert set(ours) <= set(layout.BOUNDS)


def test_engine_bounds_inside_the_layout_map_exactly():
    bounds = (0.3, 0.5, 1.0, 2.5, INF)  # all gpuwatch bounds
    counts = [4, 6, 9, 10, 12]
    mapped = layout.remap(bounds, counts)
    at = dict(zip((*layout.BOUNDS, INF), mapped, strict=True))
    assert (at[0.3], at[0.5], at[1.0], at[2.5], at[INF]) == (4, 6, 9, 10, 12)
    assert at[0.15] == pytest.approx(2.0)  # linear from 0 below the engine's first bound
    assert at[7680.0] == 10  # beyond its last finite bound: known only to be slower
    # (a quantile in the engine's +Inf bucket is "slower than its last bound" on both sides,
    # which PromQL writes as that bound: the engine's last, or gpuwatch's)
    for q in (0.1, 0.5, 0.8):
        assert histogram_quantile(q, (*layout.BOUNDS, INF), mapped) == pytest.approx(
            histogram_quantile(q, bounds, counts))


def _layout_bucket(v: float) -> tuple[float, float]:
    edges = (0.0, *layout.BOUNDS)
    for lo, hi in itertools.pairwise(edges):
        if v <= hi:
            return lo, hi
    return layout.BOUNDS[-1], INF


@settings(max_examples=300, deadline=None)
@given(st_.lists(st_.floats(1e-4, 1000.0), min_size=1, max_size=25, unique=True),
       st_.lists(st_.integers(0, 50), min_size=26, max_size=26),
       st_.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_a_mapped_quantile_stays_in_the_layout_bucket_of_the_engines(bounds, adds, q):
    bounds = (*sorted(bounds), INF)
    counts, total = [], 0
    for a in adds[:len(bounds)]:
        total += a
        counts.append(total)
    if total == 0:
        return
    engine = histogram_quantile(q, bounds, counts)
    ours = histogram_quantile(q, (*layout.BOUNDS, INF), layout.remap(bounds, counts))
    if engine >= bounds[-2] or engine > layout.BOUNDS[-1]:
        return  # in the engine's +Inf bucket: neither knows more than "slower"
    lo, hi = _layout_bucket(engine)
    assert lo - 1e-9 <= ours <= hi + 1e-9, (engine, ours)


def test_mapped_buckets_only_grow_when_the_engines_do():
    rng = random.Random(7)
    bounds = (0.001, 0.02, 0.04, 0.25, 0.8, 7.5, 40.0, INF)
    counts = [0] * len(bounds)
    last = layout.remap(bounds, counts)
    for _ in range(200):
        i = rng.randrange(len(bounds))
        counts = [c + (1 if k >= i else 0) for k, c in enumerate(counts)]
        now = layout.remap(bounds, counts)
        assert all(b >= a for a, b in zip(last, now, strict=True))
        last = now


# -- the analyzer -----------------------------------------------------------------------------

def run(*samples: EngineSample, config=None, step: float = 30.0) -> Derived:
    analyzer, derived, conditions = EngineAnalyzer(config), Derived(), Conditions()
    for i, s in enumerate(samples):
        s.t = step * i
        analyzer.update(Tick(t=step * i, engines=[s]), derived, conditions)
    derived.events = conditions  # type: ignore[attr-defined]  # the episodes, for the tests
    return derived


def vllm_queue(t_le_03: int, total: int, seconds: float, start: float | None = 1.0) -> str:
    """A vLLM exposition whose queue histogram has t_le_03 requests in its first bucket."""
    lines = ['vllm:num_requests_running{engine="0",model_name="m"} 0',
             'vllm:num_requests_waiting{engine="0",model_name="m"} 0']
    for le in (0.3, 0.5, 1.0, "+Inf"):
        v = t_le_03 if le == 0.3 else total
        lines.append(f'vllm:request_queue_time_seconds_bucket{{engine="0",le="{le}",'
                     f'model_name="m"}} {v}')
    lines += [f'vllm:request_queue_time_seconds_count{{engine="0",model_name="m"}} {total}',
              f'vllm:request_queue_time_seconds_sum{{engine="0",model_name="m"}} {seconds}']
    if start is not None:
        lines.append(f"process_start_time_seconds {start}")
    return "\n".join(lines) + "\n"


def test_an_empty_queue_reads_at_most_the_first_bound_and_never_fires():
    cfg = SignalsConfig(queue=QueueSignalConfig(slo_seconds=0.25, min_requests=1))
    config = type("C", (), {"signals": cfg})()
    # 200 requests that waited 28 microseconds on average, all in vLLM's first (0.3 s) bucket
    derived = run(*(EngineSample(name="v", exposition=vllm_queue(100 * k, 100 * k, 0.0028 * k))
                    for k in range(1, 4)), config=config)
    st = derived.engines["v"]
    assert st.queue_latency_seconds["0.95"] == 0.3  # "at most 0.3 s", not 0.285
    assert st.sli_below_resolution["queue"] == ["0.5", "0.95", "0.99"]
    assert st.sli_mean_seconds["queue"] == pytest.approx(2.8e-5)
    assert st.sli_resolution_seconds["queue"] == 0.3
    assert not [e for e in derived.events.active.values() if e.signal == "queue_latency"]
    # a real queue above the first bucket is judged as before
    slow = run(*(EngineSample(name="v", exposition=vllm_queue(0, 100 * k, 40.0 * k))
                 for k in range(1, 4)), config=config)
    assert [e.signal for e in slow.events.active.values()] == ["queue_latency"]


def test_the_quantile_flag_is_only_for_the_first_bucket():
    bounds = (0.3, 0.5, 1.0, INF)
    assert slis.quantile(0.95, bounds, [100, 100, 100, 100]) == (0.3, True)
    assert slis.quantile(0.5, bounds, [40, 100, 100, 100])[1] is False
    v, first = slis.quantile(0.5, (0.0, 0.1, 1.0, INF), [60, 100, 100, 100])
    assert (v, first) == (0.0, False)  # at zero: known exactly
    assert slis.quantile(0.9, (0.0, 0.1, 1.0, INF), [60, 100, 100, 100]) == (0.1, True)


def test_errors_as_the_http_layer_answered_them_from_a_real_vllm():
    # a real vLLM 0.32 that refused 6 requests (400, 404) and lost 4 clients mid-stream
    client = text("vllm-0.32.0-cpu-real-client.prom")
    r, _ = read(client)
    assert r.counters[""] == {"client:ok": 34.0, "client:error": 6.0}
    # the scrape before: 24 requests served, nothing refused yet
    before = client.replace('status="4xx"} 6.0', 'status="4xx"} 0.0').replace(
        'status="2xx"} 34.0', 'status="2xx"} 24.0').replace(
        'finished_reason="length",model_name="tiny-llama"} 30.0',
        'finished_reason="length",model_name="tiny-llama"} 24.0')
    derived = run(EngineSample(name="v", exposition=before),
                  EngineSample(name="v", exposition=client))
    st = derived.engines["v"]
    assert st.client_requests_total == {"ok": 34.0, "error": 6.0}
    # 6 refused of the 16 the client sent; the engine finished its 6 without an error
    assert st.request_error_ratios == {"client": pytest.approx(6 / 16), "engine": 0.0}
    got = exported(derived)
    ratios = {lab["seen_by"]: v for lab, v in got["gpuwatch_engine_request_error_ratio"]}
    assert ratios == {"client": pytest.approx(6 / 16), "engine": 0.0}
    outcomes = {lab["outcome"]: v for lab, v in got["gpuwatch_engine_client_requests_total"]}
    assert outcomes == {"ok": 34.0, "error": 6.0}


def test_a_status_counter_born_in_the_window_counts_from_zero():
    # vLLM's HTTP layer creates its 4xx series at the first refused request
    client = text("vllm-0.32.0-cpu-real-client.prom")
    before = "\n".join(x for x in client.splitlines() if 'status="4xx"' not in x).replace(
        'status="2xx"} 34.0', 'status="2xx"} 24.0')
    derived = run(EngineSample(name="v", exposition=before),
                  EngineSample(name="v", exposition=client))
    assert derived.engines["v"].request_error_ratios["client"] == pytest.approx(6 / 16)


def test_no_refusal_yet_is_an_error_count_of_zero_in_the_metrics():
    # before its 4xx series exists, gpuwatch's error counter is there at 0: one born at 6
    # would hide those 6 from Prometheus's rate(); aborts, which vLLM cannot count, are not
    served = "\n".join(x for x in text("vllm-0.32.0-cpu-real-client.prom").splitlines()
                       if 'status="4xx"' not in x)
    derived = run(EngineSample(name="v", exposition=served),
                  EngineSample(name="v", exposition=served))
    assert derived.engines["v"].client_requests_total == {"ok": 34.0, "error": 0.0}
    outcomes = {lab["outcome"]: v for lab, v in
                exported(derived)["gpuwatch_engine_client_requests_total"]}
    assert outcomes == {"ok": 34.0, "error": 0.0}


def triton(failures: int, ok: int, other_ok: int) -> str:
    rows = []
    for model, succ, fail in (("echo_text", ok, failures), ("scale", other_ok, 0)):
        rows.append(f'nv_inference_request_success{{model="{model}",version="1"}} {succ}')
        rows.append(f'nv_inference_request_failure{{model="{model}",reason="BACKEND",'
                    f'version="1"}} {fail}')
        rows.append(f'nv_inference_request_duration_us{{model="{model}",version="1"}} '
                    f"{(succ + fail) * 1000}")
        rows.append(f'nv_inference_queue_duration_us{{model="{model}",version="1"}} '
                    f"{(succ + fail) * 100}")
        rows.append(f'nv_inference_pending_request_count{{model="{model}",version="1"}} 0')
    return "\n".join(rows) + "\nnv_cpu_utilization 0.5\n"


def test_triton_keeps_each_models_errors_and_a_stable_engine_label():
    # echo_text fails 20 % of its requests, scale none, and scale has 9x the traffic
    derived = run(EngineSample(name="t", exposition=triton(0, 0, 0)),
                  EngineSample(name="t", exposition=triton(20, 80, 900)))
    st = derived.engines["t"]
    assert st.model == "" and set(st.models) == {"echo_text", "scale"}
    assert st.models["echo_text"].request_error_ratios["engine"] == pytest.approx(0.2)
    assert st.models["scale"].request_error_ratios["engine"] == 0.0
    assert st.request_error_ratio == pytest.approx(20 / 1000)  # the engine as a whole
    got = exported(derived)
    ratios = {(lab["model"], lab["seen_by"]): v
              for lab, v in got["gpuwatch_engine_request_error_ratio"]}
    assert ratios == {("echo_text", "engine"): pytest.approx(0.2), ("scale", "engine"): 0.0}
    assert got["gpuwatch_engine_up"] == [({"engine": "t", "kind": "triton", "model": ""}, 1.0)]
    assert got["gpuwatch_engine_models"][0][1] == 2


def test_triton_with_no_model_loaded_is_up_and_serves_nothing():
    empty = "nv_pinned_memory_pool_total_bytes 268435456\nnv_cpu_utilization 0.1\n"
    derived = run(EngineSample(name="t", exposition=triton(0, 5, 5)),
                  EngineSample(name="t", exposition=empty),
                  EngineSample(name="t", exposition=empty))
    st = derived.engines["t"]
    assert st.up and st.models_loaded == 0 and st.models == {}
    assert not derived.events.active.values()
    got = exported(derived)
    assert got["gpuwatch_engine_up"] == [({"engine": "t", "kind": "triton", "model": ""}, 1.0)]
    assert got["gpuwatch_engine_models"][0][1] == 0


def counters(n: float, start: float | None = None) -> str:
    body = (f'vllm:num_requests_running{{engine="0",model_name="m"}} 1\n'
            f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {n}\n'
            f'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {100 * n}\n'
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {50 * n}\n')
    return body + (f"process_start_time_seconds {start}\n" if start else "")


def test_two_replicas_without_a_start_time_are_ambiguous_and_derive_nothing():
    # two processes behind one URL, answering in turn; their true preemption rate is 0
    answers = [counters(1000.0 if i % 2 else 10.0) for i in range(12)]
    derived = run(*(EngineSample(name="v", exposition=a) for a in answers), step=5.0)
    st = derived.engines["v"]
    assert st.up and st.ambiguous and "several processes" in st.reason
    assert st.preemption_rate_per_second is None and st.kv_cache_hit_ratio is None
    assert st.preemptions_total is None and st.restarts_total <= 1
    got = exported(derived)
    assert got["gpuwatch_engine_ambiguous"][0][1] == 1
    assert "gpuwatch_engine_preemptions_total" not in got
    assert "gpuwatch_engine_kv_cache_hit_ratio" not in got
    assert got["gpuwatch_engine_requests_running"][0][1] == 1  # gauges: the last answer's


def test_replicas_that_keep_flapping_stay_ambiguous():
    analyzer, derived, conditions = EngineAnalyzer(), Derived(), Conditions()
    seen = []
    for i in range(200):  # 1000 s of flips, the window is 300 s
        sample = EngineSample(name="v", t=5.0 * i,
                              exposition=counters(1000.0 if i % 2 else 10.0))
        analyzer.update(Tick(t=5.0 * i, engines=[sample]), derived, conditions)
        st = derived.engines["v"]
        seen.append((st.ambiguous, st.preemptions_total, st.restarts_total))
    assert all(a and p is None and r <= 1 for a, p, r in seen[4:]), seen


def test_one_restart_is_counted_once_and_a_calm_endpoint_is_not_ambiguous():
    answers = [counters(n) for n in (10, 20, 30, 1, 5, 9, 13, 17)]  # restarts once
    derived = run(*(EngineSample(name="v", exposition=a) for a in answers), step=5.0)
    st = derived.engines["v"]
    assert not st.ambiguous and st.restarts_total == 1
    assert st.preemptions_total == 30 + 17  # monotonic across the restart


def test_an_ambiguous_endpoint_that_calms_down_counts_again():
    flapping = [counters(1000.0 if i % 2 else 10.0) for i in range(6)]
    calm = [counters(2000.0 + i) for i in range(80)]
    derived = run(*(EngineSample(name="v", exposition=a) for a in flapping + calm), step=5.0)
    st = derived.engines["v"]
    assert not st.ambiguous and st.preemptions_total is not None
    assert st.preemption_rate_per_second == pytest.approx(1 / 5)


def test_the_restart_counter_never_goes_back_when_replicas_are_found_out():
    # with a start time each, two processes alternating are replicas, not restarts
    answers = [counters(100.0 + i, start=1.0 if i % 2 else 2.0) for i in range(8)]
    derived = run(*(EngineSample(name="v", exposition=a) for a in answers), step=5.0)
    st = derived.engines["v"]
    assert st.replicas == 2 and st.restarts_detected == 0 and st.restarts_total == 1
    assert not st.ambiguous
