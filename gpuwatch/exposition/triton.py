"""NVIDIA Triton Inference Server (docs/user_guide/metrics.md), with the TensorRT-LLM
backend's nv_trt_llm_* gauges where present.

Triton's queue time is a counter of microseconds (nv_inference_queue_duration_us) next to the
request count (nv_inference_request_success): that gives a windowed mean, not quantiles.
Requests waiting are nv_inference_pending_request_count, or the TensorRT-LLM batch
manager's own queue (request_type="waiting") when it reports one; KV usage comes only from
the TensorRT-LLM block gauges. Series are per model and version, summed across models.
"""

from __future__ import annotations

from gpuwatch.exposition import common as c
from gpuwatch.exposition.parse import Exposition, wanted_names

PREFIXES = ("nv_inference_", "nv_trt_llm_")
WANTED = wanted_names((
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
    r = c.Reading(kind="triton", generation="triton")
    trt = TRT in expo
    r.generation = "triton-trtllm" if trt else "triton"
    r.model = c.model_name(expo, (TRT, "nv_inference_request_success"), "model")
    r.ranks = c.count_groups(expo, "nv_inference_request_success", GROUP)

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
        r.missing[c.QUEUE_LATENCY] = (
            "Triton exposes cumulative queue time, not a histogram: only the mean is available"
        )
    else:
        r.missing[c.QUEUE_LATENCY] = "nv_inference_queue_duration_us " + c.NOT_EXPOSED
        r.missing[c.QUEUE_MEAN] = "nv_inference_queue_duration_us " + c.NOT_EXPOSED
    return r


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
