"""Prometheus text of a simulated vLLM server (V1 >= 0.9 names, as vLLM 0.33.0 writes them).

Counters and histograms are pure functions of the time since the engine started, so a
replay of the recording sees exactly what the live run saw. They are well formed as a real
engine's are: every counter and bucket only grows (they are integrals of non-negative
rates, floored), buckets are cumulative in `le`, and the +Inf bucket equals `_count`.

The formulas, for elapsed time e (seconds):
- requests that left the queue: floor(REQUESTS_PER_SECOND * e);
- prefix-cache queries: floor(REQUESTS_PER_SECOND * PROMPT_TOKENS_PER_REQUEST * e); hits
  are the integral of that rate times a hit ratio drifting between ~0.5 and ~0.75;
- preemptions: floor(e / PREEMPT_EVERY_SECONDS);
- queue times: lognormal (sigma QUEUE_SIGMA) whose median changes every SEGMENT_SECONDS
  through the traffic's medians (a cycle, QUEUE_MEDIANS by default) times its load; bucket
  le counts the integral of REQUESTS_PER_SECOND times the CDF at le, the sum the integral
  of the rate times the mean.
"""

from __future__ import annotations

import math

from gpuwatch.sources.simulate.serving_text import serving_lines
from gpuwatch.sources.simulate.workload import (
    CYCLING,
    PREEMPT_EVERY_SECONDS,
    PROMPT_TOKENS_PER_REQUEST,
    QUEUE_BUCKETS,
    QUEUE_SIGMA,
    REQUESTS_PER_SECOND,
    Traffic,
    finished_total,
    lognormal_cdf,
    queries_total,
    queue_seconds_total,
    segments_integral,
)

HIT_RATIO_MEAN, HIT_RATIO_SWING, HIT_RATIO_PERIOD = 0.62, 0.12, 300.0


def hits_total(e: float) -> float:
    e = max(e, 0.0)
    swing = HIT_RATIO_SWING * HIT_RATIO_PERIOD * (1 - math.cos(e / HIT_RATIO_PERIOD))
    rate = REQUESTS_PER_SECOND * PROMPT_TOKENS_PER_REQUEST
    return float(min(math.floor(rate * (HIT_RATIO_MEAN * e + swing)), queries_total(e)))


def preemptions_total(e: float) -> float:
    return float(math.floor(max(e, 0.0) / PREEMPT_EVERY_SECONDS))


def queue_buckets(e: float, traffic: Traffic = CYCLING) -> list[float]:
    """Cumulative counts of QUEUE_BUCKETS at elapsed e (without +Inf)."""
    e = max(e, 0.0)
    finished = finished_total(e)
    return [
        min(float(math.floor(REQUESTS_PER_SECOND * segments_integral(
            e, lambda m, le=le: lognormal_cdf(le, m, QUEUE_SIGMA), traffic))), finished)
        for le in QUEUE_BUCKETS
    ]


def _fmt(v: float) -> str:
    return repr(float(v))


def vllm_exposition(elapsed: float, model: str, engine_index: str = "0",
                    gpu_memory_utilization: float = 0.9, num_gpu_blocks: int = 27000,
                    traffic: Traffic = CYCLING) -> str:
    e = max(elapsed, 0.0)
    labels = f'engine="{engine_index}",model_name="{model}"'
    running = 8 + round(3 * math.sin(e / 17.0))
    waiting = max(0, 2 + round(3 * math.sin(e / 41.0)))
    kv = 0.55 + 0.15 * math.sin(e / 23.0)
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {_fmt(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {_fmt(waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {_fmt(round(kv, 4))}",
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of "
        "queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        f"vllm:prefix_cache_queries_total{{{labels}}} {_fmt(queries_total(e))}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached "
        "tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{labels}}} {_fmt(hits_total(e))}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} {_fmt(preemptions_total(e))}",
        "# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase "
        "for request.",
        "# TYPE vllm:request_queue_time_seconds histogram",
    ]
    finished = finished_total(e)
    for le, count in zip(QUEUE_BUCKETS, queue_buckets(e, traffic), strict=True):
        lines.append(
            f'vllm:request_queue_time_seconds_bucket{{engine="{engine_index}",le="{float(le)}",'
            f'model_name="{model}"}} {_fmt(count)}'
        )
    lines.append(
        f'vllm:request_queue_time_seconds_bucket{{engine="{engine_index}",le="+Inf",'
        f'model_name="{model}"}} {_fmt(finished)}'
    )
    lines += [
        f"vllm:request_queue_time_seconds_count{{{labels}}} {_fmt(finished)}",
        f"vllm:request_queue_time_seconds_sum{{{labels}}} "
        f"{_fmt(queue_seconds_total(e, traffic))}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching='
        f'"True",engine="{engine_index}",gpu_memory_utilization="{gpu_memory_utilization}",'
        f'num_cpu_blocks="0",num_gpu_blocks="{num_gpu_blocks}"}} 1.0',
    ]
    lines += serving_lines(e, model, engine_index, waiting, traffic)
    return "\n".join(lines) + "\n"
