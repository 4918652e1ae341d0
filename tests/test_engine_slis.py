"""Serving SLIs: TTFT / ITL / E2E quantiles from bucket increases, means from sums, tokens,
finished requests by reason, error ratio, waiting by reason; absent where an engine lacks
them, with the reason in /api/state."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gpuwatch.exporter.families import engines as family
from gpuwatch.exporter.families import serving
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.exporter.state_json import state_document
from gpuwatch.exposition.layout import LE_LABELS
from gpuwatch.model import EngineSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.engine import EngineAnalyzer
from gpuwatch.signals.windows import histogram_quantile

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
GENERATED = ("vllm-0.11-deprecated", "nim-llm-1.x", "sglang-underscore")


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def run(*texts: str, t0: float = 0.0, step: float = 30.0):
    analyzer, derived, conditions = EngineAnalyzer(), Derived(), Conditions()
    for i, body in enumerate(texts):
        tick = Tick(t=t0 + step * i, engines=[EngineSample(name="e", exposition=body)])
        analyzer.update(tick, derived, conditions)
    return derived


def exported(derived: Derived) -> dict[str, list]:
    registry = CollectorRegistry()
    snap = Snapshot(derived=derived)
    registry.register(type("C", (), {
        "collect": lambda self: [*family.collect(snap), *serving.collect(snap)]})())
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def buckets(body: str, name: str) -> tuple[tuple[float, ...], list[float]]:
    """Cumulative buckets of one histogram, read independently of gpuwatch's parser."""
    by_le: dict[float, float] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            if s.name == name + "_bucket":
                le = float(s.labels["le"])
                by_le[le] = by_le.get(le, 0.0) + s.value
    bounds = tuple(sorted(by_le))
    return bounds, [by_le[b] for b in bounds]


@pytest.mark.parametrize(("sli", "engine_name", "metric"), [
    ("ttft", "vllm:time_to_first_token_seconds", "gpuwatch_engine_time_to_first_token"),
    ("itl", "vllm:inter_token_latency_seconds", "gpuwatch_engine_inter_token_latency"),
    ("e2e", "vllm:e2e_request_latency_seconds", "gpuwatch_engine_e2e_request_latency"),
])
def test_vllm_quantiles_are_histogram_quantile_of_bucket_increases(sli, engine_name, metric):
    first = text("vllm-0.33.0-statlogger.prom")
    later = text("vllm-0.33.0-statlogger-later.prom")
    bounds, c0 = buckets(first, engine_name)
    _, c1 = buckets(later, engine_name)
    deltas = [b - a for a, b in zip(c0, c1, strict=True)]
    assert deltas[-1] > 0
    derived = run(first, later)
    st = derived.engines["e"]
    got = exported(derived)
    by_q = {lab["quantile"]: v for lab, v in got[metric + "_window_seconds"]}
    assert set(by_q) == {"0.5", "0.95", "0.99"}
    for q, v in by_q.items():
        assert v == pytest.approx(histogram_quantile(float(q), bounds, deltas))
    assert st.sli_requests_in_window[sli] == deltas[-1]
    # count and sum are the engine's cumulative ones, the mean the window's
    assert next(v for _, v in got[metric + "_seconds_count"]) == c1[-1]
    _, s0 = buckets_sum(first, engine_name)
    _, s1 = buckets_sum(later, engine_name)
    assert next(v for _, v in got[metric + "_mean_seconds"]) == pytest.approx(
        (s1 - s0) / deltas[-1])
    # the buckets on gpuwatch's layout, cumulative, ending in the engine's count
    mapped = [v for _, v in got[metric + "_seconds_bucket"]]
    assert len(mapped) == len(LE_LABELS) and mapped == sorted(mapped) and mapped[-1] == c1[-1]
    assert st.sli_source[sli] == engine_name


def buckets_sum(body: str, name: str) -> tuple[float, float]:
    values = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples
              if s.name in (name + "_count", name + "_sum")}
    return values[name + "_count"], values[name + "_sum"]


@pytest.mark.parametrize("base", GENERATED)
def test_every_dialect_gives_the_hand_computed_slis(base):
    derived = run(text(f"{base}.prom"), text(f"{base}-later.prom"))
    st = derived.engines["e"]
    assert st.up, st.reason
    # 10 requests at 0.05 s and 10 at 2 s in the window: p50 at the 0.06 bound, p95 in the
    # (1, 2.5] bucket, 9 of its 10 requests in: 1 + 1.5 * 0.9
    assert st.sli_quantiles_seconds["ttft"]["0.5"] == pytest.approx(0.06)
    assert st.sli_quantiles_seconds["ttft"]["0.95"] == pytest.approx(2.35)
    assert st.sli_quantiles_seconds["e2e"]["0.95"] == pytest.approx(4.75)
    assert st.sli_quantiles_seconds["itl"]["0.5"] == pytest.approx(0.0175)
    assert st.prompt_tokens_total == 3000 and st.generation_tokens_total == 1500
    if base == "sglang-underscore":
        assert st.request_error_ratio is None
        assert "no finished requests" in st.missing["requests_finished"]
    elif base == "nim-llm-1.x":  # successes and failures, no reasons
        assert st.request_error_ratio == pytest.approx(1 / 20)
        assert st.requests_finished_total == {"ok": 29, "error": 1}
    else:
        assert st.request_error_ratio == pytest.approx(1 / 20)
        assert st.requests_finished_total == {"stop": 27, "length": 2, "abort": 0, "error": 1}


def test_restart_keeps_counters_monotonic_and_quantiles_sane():
    a, b = text("vllm-0.11-deprecated.prom"), text("vllm-0.11-deprecated-later.prom")
    analyzer, derived, conditions = EngineAnalyzer(), Derived(), Conditions()
    seen = []
    for i, body in enumerate((a, b, a, b)):  # the engine restarts after the second scrape
        analyzer.update(Tick(t=30.0 * i, engines=[EngineSample(name="e", exposition=body)]),
                        derived, conditions)
        st = derived.engines["e"]
        seen.append((st.prompt_tokens_total, st.requests_finished_total.get("stop")))
        for qs in st.sli_quantiles_seconds.values():
            assert all(0 <= v < 100 for v in qs.values())
        if st.request_error_ratio is not None:
            assert 0 <= st.request_error_ratio <= 1
    assert seen == [(1000, 9), (3000, 27), (4000, 36), (6000, 54)]
    assert st.restarts_detected == 1


def test_itl_falls_back_to_the_removed_tpot_name_then_to_per_request_tpot():
    lines = text("vllm-0.11-deprecated.prom").splitlines()
    later = text("vllm-0.11-deprecated-later.prom").splitlines()

    def without(rows, needle):
        return "\n".join(x for x in rows if needle not in x) + "\n"

    old = run(without(lines, "inter_token"), without(later, "inter_token")).engines["e"]
    assert old.sli_source["itl"] == "vllm:time_per_output_token_seconds"
    assert old.sli_quantiles_seconds["itl"]["0.5"] == pytest.approx(0.0175)
    no_itl = [without(x, "inter_token") for x in (lines, later)]
    no_itl = [without(x.splitlines(), "vllm:time_per_output") for x in no_itl]
    # vLLM has an ITL alias, so its per-request TPOT is not read in its place
    st = run(*no_itl).engines["e"]
    assert "itl" not in st.sli_quantiles_seconds
    assert "inter_token_latency_seconds" in st.missing["itl"]


def test_triton_gives_a_mean_e2e_latency_and_an_error_ratio_from_the_real_server():
    idle = text("triton-2.51-pytriton-0.7.0-real-idle.prom")
    load = text("triton-2.51-pytriton-0.7.0-real-load.prom")

    def total(body, name):
        return math.fsum(s.value for f in text_string_to_metric_families(body)
                         for s in f.samples if s.name in (name, name + "_total"))

    dur = total(load, "nv_inference_request_duration_us") - total(
        idle, "nv_inference_request_duration_us")
    n = total(load, "nv_inference_request_success") - total(idle, "nv_inference_request_success")
    assert n > 0
    derived = run(idle, load)
    st = derived.engines["e"]
    assert st.sli_mean_seconds["e2e"] == pytest.approx(dur / n * 1e-6)
    assert "only the mean" in st.missing["e2e"]
    got = exported(derived)
    assert "gpuwatch_engine_e2e_request_latency_mean_seconds" in got
    assert got["gpuwatch_engine_e2e_request_latency_seconds_count"][0][1] == 43
    assert got["gpuwatch_engine_e2e_request_latency_seconds_sum"][0][1] == pytest.approx(1.297512)
    # no quantiles of gpuwatch's own, and only the +Inf bucket
    assert got["gpuwatch_engine_e2e_request_latency_seconds_bucket"] == [
        ({"engine": "e", "kind": "triton", "model": "scale", "le": "+Inf"}, 43)]
    assert st.requests_finished_total.keys() == {"ok", "abort", "error"}
    assert st.request_error_ratio == 0.0
    assert "gpuwatch_engine_time_to_first_token_seconds" not in got
    assert "no time to first token" in st.missing["ttft"]


def test_an_engine_without_slis_exports_none_and_says_why_in_api_state():
    derived = run(text("llamacpp-0.3.36-real-load.prom"), text("llamacpp-0.3.36-real-after.prom"))
    got = exported(derived)
    for name in ("gpuwatch_engine_time_to_first_token_seconds",
                 "gpuwatch_engine_e2e_request_latency_mean_seconds",
                 "gpuwatch_engine_requests_finished_total",
                 "gpuwatch_engine_request_error_ratio"):
        assert name not in got
    # llama.cpp counts processed and cached prompt tokens apart: both are prompt tokens
    assert got["gpuwatch_engine_prompt_tokens_total"][0][1] == 48 + 252
    assert got["gpuwatch_engine_generation_tokens_total"][0][1] == 3840
    eng = state_document(Snapshot(derived=derived))["signals"]["engines"]["e"]
    assert "llamacpp exposes no time to first token" in eng["missing"]["ttft"]
    assert isinstance(eng["unread_families"], list)


def test_waiting_by_reason_and_engine_down_clears_the_slis():
    derived = run(text("vllm-0.33.0-statlogger.prom"), text("vllm-0.33.0-statlogger-later.prom"))
    st = derived.engines["e"]
    assert st.requests_waiting_by_reason == {"capacity": 1.0, "deferred": 1.0}
    by = {lab["reason"]: v
          for lab, v in exported(derived)["gpuwatch_engine_requests_waiting_by_reason"]}
    assert by == {"capacity": 1.0, "deferred": 1.0}
    analyzer = EngineAnalyzer()
    conditions = Conditions()
    derived = Derived()
    for i, sample in enumerate((
        EngineSample(name="e", exposition=text("vllm-0.33.0-statlogger.prom")),
        EngineSample(name="e", exposition=text("vllm-0.33.0-statlogger-later.prom")),
        EngineSample(name="e", error="connection refused"),
    )):
        analyzer.update(Tick(t=30.0 * i, engines=[sample]), derived, conditions)
    st = derived.engines["e"]
    assert not st.up and st.sli_quantiles_seconds == {} and st.prompt_tokens_total is None
    assert st.missing["ttft"] == "engine down"
    got = exported(derived)
    assert not {k for k in got if ("token" in k or "finished" in k) and "pool" not in k}
    # the pool it planned is still held while its endpoint is down (a memory fact)
    assert got["gpuwatch_engine_kv_cache_pool_tokens"][0][1] == 432000


def test_hostile_reasons_are_bounded():
    rows = [f'vllm:num_requests_waiting_by_reason{{engine="0",reason="r{i}{"x" * 500}"}} 1'
            for i in range(5000)]
    body = text("vllm-0.33.0-statlogger.prom") + "\n".join(rows) + "\n"
    st = run(body).engines["e"]
    assert len(st.requests_waiting_by_reason) <= 16
    assert all(len(k) <= 64 for k in st.requests_waiting_by_reason)
    rows = [f'vllm:request_success_total{{engine="0",finished_reason="weird{i}"}} 1'
            for i in range(500)]
    st = run(text("vllm-0.33.0-statlogger.prom") + "\n".join(rows) + "\n").engines["e"]
    assert set(st.requests_finished_total) <= {"stop", "length", "abort", "error", "other"}
    assert st.requests_finished_total["other"] == 500


REAL_VLLM = sorted(FIXTURES.glob("vllm-*-real-idle.prom"))


@pytest.mark.parametrize("idle", REAL_VLLM, ids=lambda p: p.name)
def test_a_real_vllm_server_under_load_moves_the_slis(idle):
    load = idle.with_name(idle.name.replace("-idle", "-load"))
    after = idle.with_name(idle.name.replace("-idle", "-after"))
    derived = run(idle.read_text(), load.read_text(), after.read_text())
    st = derived.engines["e"]
    assert st.up and st.kind == "vllm", st.reason
    for sli, name in (("ttft", "vllm:time_to_first_token_seconds"),
                      ("e2e", "vllm:e2e_request_latency_seconds")):
        assert st.sli_source[sli] == name
        bounds, c0 = buckets(idle.read_text(), name)
        _, c1 = buckets(after.read_text(), name)
        deltas = [b - a for a, b in zip(c0, c1, strict=True)]
        assert deltas[-1] > 0, "the load finished no request"
        assert st.sli_quantiles_seconds[sli]["0.95"] == pytest.approx(
            histogram_quantile(0.95, bounds, deltas))
    assert "itl" in st.sli_quantiles_seconds
    assert st.prompt_tokens_total > 0 and st.generation_tokens_total > 0
    assert sum(st.requests_finished_total.values()) > 0
    assert st.request_error_ratio == 0.0
    assert st.requests_waiting_by_reason.keys() >= {"capacity"}
    # read for the memory model now, and the new families of 0.32 are listed
    assert "vllm:engine_sleep_state" not in st.unread_families and st.sleep_level == 0
    assert "vllm:estimated_flops_per_gpu" in st.unread_families


def test_the_real_llamacpp_server_counts_tokens_and_its_mean_times_per_token():
    names = [f"llamacpp-0.3.36-real-{p}.prom" for p in ("idle", "load", "after")]
    derived = run(*(text(n) for n in names))
    st = derived.engines["e"]

    def total(body, name):
        return math.fsum(s.value for f in text_string_to_metric_families(body)
                         for s in f.samples if s.name == name)

    last = text(names[-1])
    assert st.generation_tokens_total == total(last, "llamacpp:tokens_predicted_total") > 0
    assert st.prompt_tokens_total == total(last, "llamacpp:prompt_tokens_total") + total(
        last, "llamacpp:prompt_tokens_cached_total") > 0
    # no histogram, so no quantiles; the time per token it decoded and per prompt token it
    # processed over the window, from its own seconds and token counters
    assert st.sli_quantiles_seconds == {}
    prev = text(names[0])  # the window (300 s) holds all three scrapes

    def per_token(seconds, tokens):
        return (total(last, seconds) - total(prev, seconds)) / (
            total(last, tokens) - total(prev, tokens))

    assert st.sli_mean_seconds["itl"] == pytest.approx(per_token(
        "llamacpp:tokens_predicted_seconds_total", "llamacpp:tokens_predicted_total"))
    assert st.sli_mean_seconds["ptpt"] == pytest.approx(per_token(
        "llamacpp:prompt_seconds_total", "llamacpp:prompt_tokens_total"))
    assert 1e-5 < st.sli_mean_seconds["itl"] < 0.01
    assert "no time to first token" in st.missing["ttft"]
    assert "llamacpp:n_decode" in st.unread_families


def test_tgi_e2e_and_per_request_tpot_from_its_router_histograms():
    """TGI (router/src/server.rs): e2e and mean time per token histograms, tokens as the
    _sum of per-request histograms, failures by err; no time to first token."""
    first, later = text("tgi.prom"), text("tgi-later.prom")
    derived = run(first, later)
    st = derived.engines["e"]
    assert st.up, st.reason
    assert st.sli_source == {"e2e": "tgi_request_duration",
                             "itl": "tgi_request_mean_time_per_token_duration (per-request TPOT)",
                             "queue": "tgi_request_queue_duration"}
    # the window: 10 requests of 1.2 s, 6 of 3.5 s, 4 of 20 s. p50: the 10th of 20 is the
    # last in (1.122, 1.683], p95: the 19th in (19.18, 28.76], 3 of its 4
    e2e = st.sli_quantiles_seconds["e2e"]
    bounds, c0 = buckets(first, "tgi_request_duration")
    _, c1 = buckets(later, "tgi_request_duration")
    deltas = [b - a for a, b in zip(c0, c1, strict=True)]
    assert deltas[-1] == 20
    assert e2e["0.5"] == pytest.approx(bounds[23]) and 1.12 < bounds[23] < 1.69
    assert e2e["0.95"] == pytest.approx(bounds[29] + (bounds[30] - bounds[29]) * 3 / 4)
    assert 19 < e2e["0.95"] < 29
    # per-request TPOT, 0.02 s for half of the window's requests
    assert 0.0194 < st.sli_quantiles_seconds["itl"]["0.5"] <= 0.0292
    assert "ttft" not in st.sli_quantiles_seconds
    assert st.missing["ttft"] == "tgi exposes no time to first token metric"
    # cumulative token totals: the sums of the per-request histograms
    assert st.prompt_tokens_total == 20 * 300 + 14 * 900 + 2 * 2000 + 4 * 3000
    assert st.generation_tokens_total == 20 * 60 + 14 * 120 + 2 * 180 + 4 * 250
    # 20 successes and one generation error in the window
    assert st.requests_finished_total == {"ok": 40, "error": 2}
    assert st.request_error_ratio == pytest.approx(1 / 21)
