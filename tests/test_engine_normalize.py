"""Golden tests: each engine's exposition in -> the normalized reading out.

The expected numbers are read off the fixtures by hand (their first line says where each
came from); they are not produced by the code under test.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpuwatch.exposition import common as c
from gpuwatch.exposition import read
from gpuwatch.exposition.detect import detect_kind

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def reading(name: str, kind: str = "auto") -> c.Reading:
    r, why = read(fixture(name), kind)
    assert r is not None, why
    return r


def totals(r: c.Reading, name: str) -> float:
    return sum(g.get(name, 0.0) for g in r.counters.values())


def test_every_fixture_names_its_origin():
    files = sorted(FIXTURES.glob("*.prom"))
    assert len(files) >= 12
    for f in files:
        first = f.read_text().split("\n", 1)[0]
        assert first.startswith("# ") and len(first) > 30, f.name


@pytest.mark.parametrize(("name", "kind"), [
    ("vllm-0.33.0-statlogger.prom", "vllm"),
    ("vllm-0.8-v1-dp2.prom", "vllm"),
    ("vllm-0.7-v0.prom", "vllm"),
    ("sglang.prom", "sglang"),
    ("tgi.prom", "tgi"),
    ("llamacpp-0.3.36-real-load.prom", "llamacpp"),
    ("triton-trtllm.prom", "triton"),
])
def test_auto_detects_the_engine(name, kind):
    assert detect_kind(fixture(name)) == kind
    assert reading(name).kind == kind


def test_vllm_v1_current_names():
    r = reading("vllm-0.33.0-statlogger.prom")
    assert (r.generation, r.model, r.ranks) == ("v1", MODEL, 1)
    assert (r.requests_running, r.requests_waiting, r.kv_cache_usage_ratio) == (3, 5, 0.42)
    assert r.counters["engine=0"][c.PREFIX_QUERIES] == 1000
    assert r.counters["engine=0"][c.PREFIX_HITS] == 640
    assert r.counters["engine=0"][c.PREEMPTIONS] == 1
    assert r.prefix_unit == "tokens"
    assert r.start_time == pytest.approx(1.79602957793e9)
    # the queue-time histogram, bucket for bucket
    assert r.queue_bounds[:4] == (0.3, 0.5, 0.8, 1.0) and math.isinf(r.queue_bounds[-1])
    assert len(r.queue_bounds) == 22
    group = r.counters["engine=0"]
    assert group[c.bucket_name(0.3)] == 4 and group[c.bucket_name(2.5)] == 10
    assert group[c.QUEUE_COUNT] == 10 and group[c.QUEUE_SUM] == pytest.approx(9.03, abs=1e-3)
    # cache config kept for the memory analyzer, without the engine label
    assert r.cache_config["block_size"] == "16"
    assert r.cache_config["num_gpu_blocks"] == "27000"
    assert r.cache_config["gpu_memory_utilization"] == "0.9"
    assert "engine" not in r.cache_config
    assert r.missing == {}


def test_vllm_v1_legacy_data_parallel():
    r = reading("vllm-0.8-v1-dp2.prom")
    assert (r.generation, r.ranks, r.prefix_unit) == ("v1-legacy", 2, "blocks")
    # gauges: requests summed over both engine cores, KV usage averaged
    assert (r.requests_running, r.requests_waiting) == (5, 5)
    assert r.kv_cache_usage_ratio == pytest.approx(0.40)
    # counters stay per engine core (they restart independently)
    assert r.counters["engine=0"][c.PREFIX_QUERIES] == 400
    assert r.counters["engine=1"][c.PREFIX_HITS] == 200
    assert totals(r, c.PREEMPTIONS) == 1
    assert totals(r, c.QUEUE_COUNT) == 8
    assert r.cache_config["num_gpu_blocks"] == "14000"


def test_vllm_v0_hit_rate_gauge():
    r = reading("vllm-0.7-v0.prom")
    assert (r.generation, r.model, r.ranks) == ("v0", MODEL, 1)
    assert (r.requests_running, r.requests_waiting, r.kv_cache_usage_ratio) == (5, 7, 0.83)
    assert r.hit_ratio_gauge == 0.35
    assert not r.has_counter(c.PREFIX_HITS) and not r.has_counter(c.PREFIX_QUERIES)
    assert "hit-rate gauge" in r.missing[c.PREFIX_CACHE]
    assert totals(r, c.PREEMPTIONS) == 3
    assert totals(r, c.QUEUE_COUNT) == 20
    assert r.cache_config["num_gpu_blocks"] == "7000"


def test_vllm_v0_prefix_caching_off_is_absent_not_minus_one():
    text = fixture("vllm-0.7-v0.prom").replace(
        'vllm:gpu_prefix_cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.35',
        'vllm:gpu_prefix_cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} -1.0')
    r, _ = read(text)
    assert r.hit_ratio_gauge is None
    assert "off" in r.missing[c.KV_HIT_RATIO]


def test_vllm_prefix_caching_disabled_in_cache_config():
    text = fixture("vllm-0.33.0-statlogger.prom").replace(
        'enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    r, _ = read(text)
    assert not r.has_counter(c.PREFIX_QUERIES)
    assert "enable_prefix_caching=False" in r.missing[c.KV_HIT_RATIO]


def test_sglang_tensor_parallel_duplicates_count_once():
    r = reading("sglang.prom")
    assert (r.model, r.ranks) == (MODEL, 1)
    # two TP workers report 6 running / 9 queued each: one engine, 6 and 9
    assert (r.requests_running, r.requests_waiting) == (6, 9)
    assert r.kv_cache_usage_ratio == 0.61
    assert totals(r, c.PREFIX_QUERIES) == 50000 and totals(r, c.PREFIX_HITS) == 21000
    assert totals(r, c.PREEMPTIONS) == 2
    assert totals(r, c.QUEUE_COUNT) == 14  # 8 + 4 + 2 observations, not 28
    assert r.queue_bounds[0] == 0.0
    assert r.missing == {}


def test_tgi():
    r = reading("tgi.prom")
    assert (r.model, r.requests_running, r.requests_waiting) == ("", 8, 3)
    assert r.kv_cache_usage_ratio is None and c.KV_USAGE in r.missing
    assert c.PREFIX_CACHE in r.missing and not r.has_counter(c.PREFIX_HITS)
    assert len(r.queue_bounds) == 36  # 35 geometric buckets + +Inf
    assert r.queue_bounds[0] == pytest.approx(0.00015)
    group = r.counters[""]
    assert group[c.QUEUE_COUNT] == 20 and group[c.QUEUE_SUM] == pytest.approx(3.54)


def test_tgi_summary_gives_only_the_mean():
    text = "\n".join(line for line in fixture("tgi.prom").splitlines()
                     if "_bucket" not in line)
    text += '\ntgi_request_queue_duration{quantile="0.5"} 0.002\n'
    r, _ = read(text)
    assert r.queue_bounds == ()
    assert "mean" in r.missing[c.QUEUE_LATENCY]
    assert r.counters[""][c.QUEUE_COUNT] == 20


def test_llamacpp():
    r = reading("llamacpp-0.3.36-real-load.prom")  # a real llama-server, 2 slots, 6 clients
    assert (r.requests_running, r.requests_waiting) == (2, 4)
    assert r.kv_cache_usage_ratio is None
    assert "removed" in r.missing[c.KV_USAGE]
    # prompt_tokens_total excludes cached tokens: queries = 28 + 72
    assert totals(r, c.PREFIX_QUERIES) == 100 and totals(r, c.PREFIX_HITS) == 72
    assert c.QUEUE_LATENCY in r.missing and r.queue_bounds == ()
    idle = reading("llamacpp-0.3.36-real-idle.prom")
    assert (idle.requests_running, idle.requests_waiting) == (0, 0)
    assert totals(idle, c.PREFIX_QUERIES) == 0


def test_llamacpp_exponent_values_and_old_kv_gauge():
    real = fixture("llamacpp-0.3.36-real-load.prom")
    # the server prints with C++ stream defaults (6 significant digits): a busy one writes
    # its counters in exponent form
    busy = real.replace("llamacpp:prompt_tokens_total 28\n",
                        "llamacpp:prompt_tokens_total 1.23457e+06\n")
    assert busy != real
    assert totals(read(busy)[0], c.PREFIX_QUERIES) == 1234570 + 72
    old = real + (
        "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.25\n")
    assert read(old)[0].kv_cache_usage_ratio == 0.25
    without = "\n".join(x for x in real.splitlines() if "cached" not in x)
    r2, _ = read(without)
    assert not r2.has_counter(c.PREFIX_QUERIES) and c.KV_HIT_RATIO in r2.missing


def test_triton_with_tensorrt_llm():
    r = reading("triton-trtllm.prom")
    # Triton serves several models: none of them is the engine's, each group has its own
    assert (r.generation, r.model, r.model_label) == ("triton-trtllm", "", "model")
    assert r.group_models["model=tensorrt_llm,version=1"] == "tensorrt_llm"
    assert (r.requests_running, r.requests_waiting) == (6, 5)  # TRT-LLM active / waiting
    assert r.kv_cache_usage_ratio == 0.2
    # queue mean of the LLM model only: 3.6 s over 120 requests
    assert list(r.counters) == ["model=tensorrt_llm,version=1"]
    group = r.counters["model=tensorrt_llm,version=1"]
    assert group[c.QUEUE_SUM] == pytest.approx(3.6) and group[c.QUEUE_COUNT] == 120
    assert "histogram" in r.missing[c.QUEUE_LATENCY]


def test_triton_core_only_and_kv_from_blocks():
    core = "\n".join(x for x in fixture("triton-trtllm.prom").splitlines()
                     if not x.startswith(("nv_trt_llm_", "# HELP nv_trt", "# TYPE nv_trt")))
    r, _ = read(core)
    assert r.generation == "triton" and r.requests_running is None
    assert r.requests_waiting == 3  # pending requests, all models
    assert r.kv_cache_usage_ratio is None
    assert r.model == "" and r.models_loaded == 4
    assert sorted(set(r.group_models.values())) == [
        "ensemble", "postprocessing", "preprocessing", "tensorrt_llm"]
    assert sum(g[c.QUEUE_COUNT] for g in r.counters.values()) == 480
    no_fraction = "\n".join(x for x in fixture("triton-trtllm.prom").splitlines()
                            if "fraction" not in x)
    assert read(no_fraction)[0].kv_cache_usage_ratio == pytest.approx(1248 / 6240)


def test_explicit_kind_must_find_its_metrics():
    r, why = read(fixture("sglang.prom"), "vllm")
    assert r is None and "looks like sglang" in why
    r, why = read("<html><body>Not Found</body></html>", "vllm")
    assert r is None and "HTML" in why


@pytest.mark.parametrize(("body", "words"), [
    ("", "empty"),
    ("{\"detail\": \"Not Found\"}", "JSON"),
    ("\x00\x01\x02binary", "binary"),
    ("up 1\nnode_load1 0.5\n", "no vllm"),
])
def test_unrecognized_responses_say_why(body, words):
    r, why = read(body)
    assert r is None and words in why


def test_nan_and_negative_values_are_absent_never_zero():
    text = fixture("vllm-0.33.0-statlogger.prom")
    text = text.replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.42',
        'vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} NaN')
    text = text.replace(
        'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0',
        'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} -3')
    r, _ = read(text)
    assert r.kv_cache_usage_ratio is None and "NaN" in r.missing[c.KV_USAGE]
    assert r.requests_waiting is None and c.REQUESTS_WAITING in r.missing
    assert r.requests_running == 3


def test_one_malformed_line_loses_only_itself():
    text = fixture("vllm-0.33.0-statlogger.prom").replace(
        'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0',
        'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instr 3.0')
    r, _ = read(text)
    assert r.requests_running is None
    assert r.requests_waiting == 5 and r.kv_cache_usage_ratio == 0.42
    assert any("malformed" in n for n in r.notes)


def test_duplicate_series_keep_the_last_value():
    text = fixture("vllm-0.33.0-statlogger.prom") + (
        'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9\n')
    assert read(text)[0].requests_running == 9


def test_crlf_line_endings():
    r, _ = read(fixture("tgi.prom").replace("\n", "\r\n"))
    assert (r.requests_running, r.requests_waiting) == (8, 3)
    assert r.counters[""][c.QUEUE_COUNT] == 20


def test_the_series_cache_stays_bounded_under_churn_and_long_labels():
    import importlib

    # the package's `parse` is the function; the module holds the cache
    p = importlib.import_module("gpuwatch.exposition.parse")

    long_value = "x" * 5000
    read(f'vllm:num_requests_running{{engine="0",model_name="{long_value}"}} 1\n')
    assert not any(long_value in k for k in p._SERIES_CACHE)
    for scrape in range(5):
        text = "".join(f'vllm:num_requests_running{{engine="{scrape}-{i}",model_name="m"}} 1\n'
                       for i in range(5000))
        r, _ = read(text)
        assert r.requests_running == 5000
        assert len(p._SERIES_CACHE) <= p._SERIES_CACHE_MAX
