"""Random, truncated and hostile expositions never crash the engine path and never produce
NaN, negative rates or ratios outside 0..1."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from gpuwatch.exporter.families import engines as engine_family
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.exposition import read
from gpuwatch.model import EngineSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived, EngineState
from gpuwatch.signals.engine import EngineAnalyzer

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "engines").glob("*.prom"))
TEXTS = [f.read_text() for f in FIXTURES]

NAMES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total", "vllm:request_queue_time_seconds_bucket",
    "vllm:request_queue_time_seconds_count", "vllm:request_queue_time_seconds_sum",
    "vllm:gpu_prefix_cache_hit_rate", "vllm:cache_config_info", "process_start_time_seconds",
    "sglang:token_usage", "sglang:cached_tokens_total", "sglang:queue_time_seconds_bucket",
    "tgi_queue_size", "tgi_request_queue_duration_bucket", "llamacpp:prompt_tokens_total",
    "nv_inference_queue_duration_us", "nv_trt_llm_kv_cache_block_metrics",
]
VALUES = st.one_of(
    st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "0", "1e308", "-0", "1e-320", "abc", ""]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
)
LABEL_VALUES = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["+Inf", "0.5", "NaN", "-1", "abc", "0"]),
    st.integers(min_value=1000, max_value=200_000).map(lambda n: "x" * n),  # huge
)


@st.composite
def hostile_line(draw) -> str:
    name = draw(st.sampled_from(NAMES))
    labels = draw(st.dictionaries(
        st.sampled_from(["engine", "le", "model_name", "model", "tp_rank", "dp_rank",
                         "request_type", "kv_cache_block_type", "enable_prefix_caching"]),
        LABEL_VALUES, max_size=4))
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    if draw(st.booleans()):
        body = body[: draw(st.integers(0, len(body)))]  # unbalanced braces and quotes
    return f"{name}{{{body}}} {draw(VALUES)}"


@st.composite
def exposition(draw) -> str:
    kind = draw(st.sampled_from(["fixture", "truncated", "mutated", "hostile", "random"]))
    base = draw(st.sampled_from(TEXTS))
    if kind == "fixture":
        return base
    if kind == "truncated":
        return base[: draw(st.integers(0, len(base)))]
    if kind == "mutated":
        lines = base.split("\n")
        for _ in range(draw(st.integers(1, 6))):
            i = draw(st.integers(0, len(lines) - 1))
            lines[i] = draw(st.one_of(hostile_line(), st.text(max_size=60)))
        return "\n".join(lines)
    if kind == "hostile":
        lines = draw(st.lists(hostile_line(), min_size=1, max_size=25))
        dup = draw(st.integers(0, 3))
        return "\n".join(lines + lines[:dup])  # duplicate series too
    return draw(st.text(max_size=400))


def check_state(s: EngineState) -> None:
    for name, v in vars(s).items():
        if isinstance(v, float):
            assert math.isfinite(v), name
    for name in ("requests_running", "requests_waiting", "prefix_cache_hits_total",
                 "prefix_cache_queries_total", "preemptions_total", "preemption_rate_per_second",
                 "queue_latency_mean_seconds", "queue_requests_in_window",
                 "kv_cache_queries_in_window", "queue_requests_total", "queue_seconds_total"):
        v = getattr(s, name)
        assert v is None or v >= 0, name
    for name in ("kv_cache_usage_ratio", "kv_cache_hit_ratio"):
        v = getattr(s, name)
        assert v is None or 0 <= v <= 1, name
    for q, v in s.queue_latency_seconds.items():
        assert math.isfinite(v), q


# What the analyzer says when reading or normalizing raised: it turns any exception into
# "engine down" (a sample must never take the daemon down), which would hide its own bugs.
INTERNAL = ("could not read the exposition", "could not normalize")


def check_no_internal_failure(s: EngineState, events) -> None:
    assert not s.reason.startswith(INTERNAL), s.reason
    for ev in events:  # nothing fires on a value that is not a sane number
        assert ev.value is None or (math.isfinite(ev.value) and abs(ev.value) < 1e300), ev


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(exposition())
def test_read_never_raises(text):
    reading, why = read(text)
    assert (reading is None) == bool(why)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(exposition(), st.sampled_from(["auto", "vllm", "sglang", "tgi",
                                                          "llamacpp", "triton"])),
                min_size=1, max_size=6))
def test_analyzer_sequences_stay_finite(seq):
    analyzer = EngineAnalyzer()
    derived, conditions = Derived(), Conditions()
    for i, (text, kind) in enumerate(seq):
        sample = EngineSample(name="e", kind=kind, url="u", exposition=text, t=float(i))
        events = analyzer.update(Tick(t=float(i), engines=[sample]), derived, conditions)
        check_state(derived.engines["e"])
        check_no_internal_failure(derived.engines["e"], events)
    # and the exporter renders it without a NaN in sight
    registry = CollectorRegistry()
    registry.register(type("C", (), {"collect": lambda self: engine_family.collect(
        Snapshot(derived=derived))})())
    text = generate_latest(registry).decode()
    # (a label may read "NaN": an engine chose it; a sample value never does)
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines()
              if line and not line.startswith("#")]
    assert all(math.isfinite(float(v)) for v in values), values
    assert "gpuwatch_engine_up" in text


LABEL_TEXT = st.text(alphabet=st.sampled_from('ab_:09{}",=\\ \t+é.-'), max_size=24)


@settings(max_examples=400, deadline=None)
@given(name=st.text(alphabet=st.sampled_from("av_:1"), min_size=0, max_size=6),
       body=st.one_of(LABEL_TEXT, st.lists(
           st.tuples(st.sampled_from(["a", "le", "_x", "1b", "b c"]),
                     st.text(alphabet=st.sampled_from('xy}{, +é\\"'), max_size=5)),
           max_size=4).map(lambda kv: ",".join(f'{k}="{v}"' for k, v in kv))))
def test_the_fast_label_reader_agrees_with_the_prometheus_parser(name, body):
    from prometheus_client.parser import text_string_to_metric_families

    from gpuwatch.exposition.parse import _label_key, _plain_series

    series = f"{name}{{{body}}}"
    fast = _plain_series(series)
    if fast is None:
        return  # the parser decides
    families = list(text_string_to_metric_families(series + " 0\n"))
    (sample,) = [s for f in families for s in f.samples]
    assert fast == (sample.name, _label_key(sample.labels))
