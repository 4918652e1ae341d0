"""Prometheus text of a simulated vLLM server (V1 >= 0.9 names, as vLLM 0.33.0 writes them).

Counters and histograms are pure functions of the time since the scenario started, so a
replay of the recording sees exactly what the live run saw.
"""

from __future__ import annotations

import math

QUEUE_BUCKETS = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240,
                 480, 960, 1920, 7680)
REQUESTS_PER_SECOND = 4.0
PROMPT_TOKENS_PER_REQUEST = 500.0


def _lognormal_cdf(x: float, median: float, sigma: float) -> float:
    return 0.5 * (1 + math.erf((math.log(x) - math.log(median)) / (sigma * math.sqrt(2))))


def _fmt(v: float) -> str:
    return repr(float(v))


def vllm_exposition(elapsed: float, model: str, engine_index: str = "0",
                    gpu_memory_utilization: float = 0.9, num_gpu_blocks: int = 27000) -> str:
    e = max(elapsed, 0.0)
    labels = f'engine="{engine_index}",model_name="{model}"'
    requests = REQUESTS_PER_SECOND * e
    # Hit ratio drifts slowly between ~0.5 and ~0.75.
    hit_ratio = 0.62 + 0.12 * math.sin(e / 300.0)
    queries = math.floor(requests * PROMPT_TOKENS_PER_REQUEST)
    hits = math.floor(queries * hit_ratio)
    running = 8 + round(3 * math.sin(e / 17.0))
    waiting = max(0, 2 + round(3 * math.sin(e / 41.0)))
    kv = 0.55 + 0.15 * math.sin(e / 23.0)
    preemptions = math.floor(e / 90.0)
    median_queue = 0.25 + 0.1 * math.sin(e / 60.0)
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
        f"vllm:prefix_cache_queries_total{{{labels}}} {_fmt(queries)}",
        "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached "
        "tokens.",
        "# TYPE vllm:prefix_cache_hits_total counter",
        f"vllm:prefix_cache_hits_total{{{labels}}} {_fmt(hits)}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} {_fmt(preemptions)}",
        "# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase "
        "for request.",
        "# TYPE vllm:request_queue_time_seconds histogram",
    ]
    finished = math.floor(requests)
    total_sum = 0.0
    for le in QUEUE_BUCKETS:
        count = math.floor(finished * _lognormal_cdf(le, median_queue, 0.9))
        lines.append(
            f'vllm:request_queue_time_seconds_bucket{{engine="{engine_index}",le="{float(le)}",'
            f'model_name="{model}"}} {_fmt(count)}'
        )
    lines.append(
        f'vllm:request_queue_time_seconds_bucket{{engine="{engine_index}",le="+Inf",'
        f'model_name="{model}"}} {_fmt(finished)}'
    )
    total_sum = finished * median_queue * math.exp(0.9**2 / 2)
    lines += [
        f"vllm:request_queue_time_seconds_count{{{labels}}} {_fmt(finished)}",
        f"vllm:request_queue_time_seconds_sum{{{labels}}} {_fmt(round(total_sum, 3))}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching='
        f'"True",engine="{engine_index}",gpu_memory_utilization="{gpu_memory_utilization}",'
        f'num_cpu_blocks="0",num_gpu_blocks="{num_gpu_blocks}"}} 1.0',
    ]
    return "\n".join(lines) + "\n"
