"""The engine metric families: same names for every engine, absent means absent."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gpuwatch.exporter.families import MODULES, serving
from gpuwatch.exporter.families import engines as family
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import EngineSample, GpuSample, ProcessSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.engine import EngineAnalyzer
from tests.helpers import needs_binary

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
PAIRS = {
    "vllm": ("vllm-0.33.0-statlogger.prom", "vllm-0.33.0-statlogger-later.prom"),
    "vllm08": ("vllm-0.8-v1-dp2.prom", "vllm-0.8-v1-dp2-later.prom"),
    "vllm07": ("vllm-0.7-v0.prom", "vllm-0.7-v0.prom"),
    "sglang": ("sglang.prom", "sglang-later.prom"),
    "tgi": ("tgi.prom", "tgi-later.prom"),
    "llama": ("llamacpp-0.3.36-real-load.prom", "llamacpp-0.3.36-real-after.prom"),
    "triton": ("triton-trtllm.prom", "triton-trtllm-later.prom"),
}


def render() -> str:
    analyzer, derived, conditions = EngineAnalyzer(), Derived(), Conditions()
    gpus = [GpuSample(index=3, uuid="GPU-x", processes=[ProcessSample(pid=501)])]
    for i in range(2):
        samples = [EngineSample(name=name, url=f"http://127.0.0.1:{8000 + n}/metrics",
                                exposition=(FIXTURES / files[i]).read_text(), t=30.0 * i,
                                pids=[501] if name == "vllm" else [])
                   for n, (name, files) in enumerate(PAIRS.items())]
        samples.append(EngineSample(name="dead", kind="sglang", url="http://127.0.0.1:1/m",
                                    error="connection failed: refused", t=30.0 * i))
        analyzer.update(Tick(t=30.0 * i, engines=samples, gpus=gpus), derived, conditions)
    registry = CollectorRegistry()
    snap = Snapshot(derived=derived)
    registry.register(type("C", (), {
        "collect": lambda self: [*family.collect(snap), *serving.collect(snap)]})())
    return generate_latest(registry).decode()


def samples(text: str) -> dict[tuple[str, str], dict]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault((s.name, s.labels["engine"]), []).append((s.labels, s.value))
    return out


def test_module_is_registered():
    assert "gpuwatch.exporter.families.engines" in MODULES


def test_every_engine_has_the_same_names_where_it_has_the_signal():
    got = samples(render())

    def value(metric, engine, **labels):
        rows = [v for lab, v in got.get((metric, engine), [])
                if all(lab.get(k) == x for k, x in labels.items())]
        assert len(rows) <= 1
        return rows[0] if rows else None

    for engine in PAIRS:
        assert value("gpuwatch_engine_up", engine) == 1
        assert value("gpuwatch_engine_requests_waiting", engine) is not None
        assert value("gpuwatch_engine_requests_running", engine) is not None
    assert value("gpuwatch_engine_up", "dead") == 0
    assert [k for k in got if k[1] == "dead"] == [("gpuwatch_engine_up", "dead"),
                                                 ("gpuwatch_engine_info", "dead"),
                                                 ("gpuwatch_engine_restarts_total", "dead")]
    # KV usage: absent (not 0, not -1) for TGI and llama.cpp
    assert value("gpuwatch_engine_kv_cache_usage_ratio", "tgi") is None
    assert value("gpuwatch_engine_kv_cache_usage_ratio", "llama") is None
    assert value("gpuwatch_engine_kv_cache_usage_ratio", "triton") == 0.5
    # hit ratio: windowed from counters, the engine's own gauge for vLLM V0
    assert value("gpuwatch_engine_kv_cache_hit_ratio", "vllm", source="window") == \
        pytest.approx(998 / 1436)
    assert value("gpuwatch_engine_kv_cache_hit_ratio", "vllm07", source="engine") == 0.35
    assert value("gpuwatch_engine_kv_cache_hit_ratio", "tgi") is None
    assert value("gpuwatch_engine_prefix_cache_queries_total", "vllm08", unit="blocks") == 2000
    assert value("gpuwatch_engine_prefix_cache_hits_total", "sglang", unit="tokens") == 33000
    # windowed quantiles where there is a histogram, only the mean for Triton; the histogram
    # on gpuwatch's layout (only +Inf where the engine has just a sum and a count)
    assert value("gpuwatch_engine_queue_latency_window_seconds", "vllm", quantile="0.95") == \
        pytest.approx(13.25)
    assert value("gpuwatch_engine_queue_latency_seconds_count", "vllm") == 17
    assert value("gpuwatch_engine_queue_latency_seconds_sum", "vllm") == pytest.approx(31.97)
    assert value("gpuwatch_engine_queue_latency_seconds_bucket", "vllm", le="+Inf") == 17
    assert value("gpuwatch_engine_queue_latency_seconds_bucket", "vllm", le="0.3") == 7
    assert value("gpuwatch_engine_queue_latency_resolution_seconds", "vllm") == 0.3
    assert value("gpuwatch_engine_queue_latency_mean_seconds", "vllm") == \
        pytest.approx((31.97 - 9.03) / 7)
    assert value("gpuwatch_engine_queue_latency_window_seconds", "triton",
                 quantile="0.95") is None
    assert value("gpuwatch_engine_queue_latency_seconds_count", "triton",
                 model="tensorrt_llm") == 180
    assert [lab["le"] for lab, _ in got[("gpuwatch_engine_queue_latency_seconds_bucket",
                                         "triton")]] == ["+Inf"]
    assert value("gpuwatch_engine_queue_latency_mean_seconds", "triton") == pytest.approx(0.1)
    assert value("gpuwatch_engine_preemptions_total", "vllm08") == 2
    # the engine to GPU join
    assert value("gpuwatch_engine_gpu_info", "vllm", gpu="3", uuid="GPU-x") == 1
    assert value("gpuwatch_engine_info", "vllm08", generation="v1-legacy") == 1
    # memory facts: sleep state where the engine says, KV pool in tokens
    assert value("gpuwatch_engine_sleep_level", "vllm") == 0
    assert value("gpuwatch_engine_sleep_level", "vllm08") is None
    assert value("gpuwatch_engine_kv_cache_pool_tokens", "vllm08") == 224000
    assert value("gpuwatch_engine_kv_cache_pool_tokens", "sglang") == 161721
    assert value("gpuwatch_engine_kv_cache_pool_tokens", "tgi") is None
    # labels: engine, kind, model
    labels, _ = got[("gpuwatch_engine_up", "sglang")][0]
    assert labels == {"engine": "sglang", "kind": "sglang",
                      "model": "meta-llama/Llama-3.1-8B-Instruct"}


def test_nothing_rendered_without_engines():
    assert list(family.collect(Snapshot(derived=Derived()))) == []


@needs_binary("promtool")
def test_promtool_finds_nothing_to_complain_about():
    out = subprocess.run(["promtool", "check", "metrics"], input=render(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "" and out.stderr.strip() == "", \
        out.stdout + out.stderr
