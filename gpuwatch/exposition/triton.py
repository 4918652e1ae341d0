"""NVIDIA Triton Inference Server (docs/user_guide/metrics.md), with the TensorRT-LLM
backend's nv_trt_llm_* gauges where present.

Triton's queue time is a counter of microseconds (nv_inference_queue_duration_us) next to the
request count (nv_inference_request_success): that gives a windowed mean, not quantiles.
Requests waiting are nv_inference_pending_request_count, or the TensorRT-LLM batch
manager's own queue (request_type="waiting") when it reports one; KV usage comes only from
the TensorRT-LLM block gauges. Series are per model and version: each model keeps its own
counters (model_label), and the engine's own figures are their sum. Triton's per-model
latency summaries (summary_latencies=true) give its own quantiles, over its own window.
A Triton with no model loaded still writes its server families (pinned memory, CPU): it is
up, serving nothing.
"""

from __future__ import annotations

from gpuwatch.exposition import common as c
from gpuwatch.exposition.common import note
from gpuwatch.exposition.parse import Exposition, wanted_names

PREFIXES = ("nv_inference_", "nv_trt_llm_", "nv_pinned_memory_pool_", "nv_cpu_")
# Server families, written with or without models: they tell "no model loaded" from "down".
SERVER = ("nv_pinned_memory_pool_total_bytes", "nv_cpu_utilization")
# Triton's own latency quantiles per model (microseconds): SLI -> summary family.
SUMMARIES = {"queue": "nv_inference_queue_summary_us", "e2e": "nv_inference_request_summary_us"}
WANTED = wanted_names((
    *SERVER,
    *SUMMARIES.values(),
    "nv_inference_pending_request_count",
    "nv_inference_queue_duration_us",
    "nv_inference_request_success",
    "nv_trt_llm_request_metrics",
    "nv_trt_llm_kv_cache_block_metrics",
))
GROUP = ("model", "version")
TRT = "nv_trt_llm_request_metrics"
KV = "nv_trt_llm_kv_cache_block_metrics"


def normalize(expo: Exposition, text: str) -> c.Reading:
    r = c.Reading(kind="triton", generation="triton", model_label="model")
    trt = TRT in expo
    r.generation = "triton-trtllm" if trt else "triton"
    r.ranks = c.count_groups(expo, "nv_inference_request_success", GROUP)
    served = sorted({c.label(k, "model")[:c.MAX_MODEL_CHARS]
                     for k in expo.get("nv_inference_request_success")} - {""})
    r.served_models = served[:64]
    r.models_loaded = len(served)

    r.requests_running, _ = c.gauge(expo, [TRT], where={"request_type": "active"})
    if r.requests_running is None:
        r.missing[c.REQUESTS_RUNNING] = (
            "Triton has no running-request gauge without the TensorRT-LLM backend metrics"
        )
    r.requests_waiting, _ = c.gauge(expo, [TRT], where={"request_type": "waiting"})
    if r.requests_waiting is None:
        r.requests_waiting, why = c.gauge(expo, ["nv_inference_pending_request_count"])
        if r.requests_waiting is None:
            r.missing[c.REQUESTS_WAITING] = why or (
                "nv_inference_pending_request_count " + c.NOT_EXPOSED + " (Triton < 23.12?)"
            )
    r.kv_cache_usage_ratio = _kv_usage(expo)
    if r.kv_cache_usage_ratio is None:
        r.missing[c.KV_USAGE] = "no TensorRT-LLM KV-cache block metrics in this scrape"
    why = "Triton exposes no prefix-cache counters (its response cache is not a KV cache)"
    r.missing[c.PREFIX_CACHE] = why
    r.missing[c.KV_HIT_RATIO] = why
    r.missing[c.PREEMPTION] = "Triton exposes no preemption counter"

    # With TensorRT-LLM, judge the LLM model's queue: the ensemble and its pre- and
    # post-processing models count every request again, with their own short queues.
    llm = {c.label(k, "model") for k in expo.get(TRT)}

    def keep(key) -> bool:
        return not llm or c.label(key, "model") in llm

    have_sum = c.add_counter(r, expo, "nv_inference_queue_duration_us", c.QUEUE_SUM, GROUP,
                             scale=1e-6, keep=keep)
    have_count = c.add_counter(r, expo, "nv_inference_request_success", c.QUEUE_COUNT, GROUP,
                               keep=keep)
    if have_sum and have_count:
        r.sli_source["queue"] = "nv_inference_queue_duration_us"
        r.missing[c.QUEUE_LATENCY] = (
            "Triton exposes cumulative queue time, not a histogram: only the mean is available"
        )
    else:
        r.missing[c.QUEUE_LATENCY] = "nv_inference_queue_duration_us " + c.NOT_EXPOSED
        r.missing[c.QUEUE_MEAN] = "nv_inference_queue_duration_us " + c.NOT_EXPOSED
    _summaries(r, expo, keep)
    if not r.models_loaded:
        note(r, "no model loaded: Triton is up and serves nothing")
    return r


def _summaries(r: c.Reading, expo: Exposition, keep) -> None:
    for sli, name in SUMMARIES.items():
        for key, v in expo.get(name).items():
            q = c.label(key, "quantile")
            if not q or not keep(key) or not (0 <= v <= c.COUNTER_MAX):  # NaN: no request
                continue
            rest = tuple(kv for kv in key if kv[0] != "quantile")
            group = c.group_of(rest, GROUP)
            if group not in r.engine_quantiles and len(r.engine_quantiles) >= c.MAX_QUANTILE_GROUPS:
                continue
            r.engine_quantiles.setdefault(group, {}).setdefault(sli, {})[q[:16]] = v * 1e-6
            c.remember_model(r, group, rest)


def _kv_usage(expo: Exposition) -> float | None:
    frac, _ = c.gauge(expo, [KV], check=c.ratio_value, how="mean",
                      where={"kv_cache_block_type": "fraction"})
    if frac is not None:
        return frac
    used, _ = c.gauge(expo, [KV], where={"kv_cache_block_type": "used"})
    total, _ = c.gauge(expo, [KV], where={"kv_cache_block_type": "max"})
    if used is None or not total:
        return None
    return c.ratio_value(used / total)
