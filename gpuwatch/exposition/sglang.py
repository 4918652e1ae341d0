"""SGLang (python/sglang/srt/metrics/collector.py; needs --enable-metrics).

Scheduler gauges carry tp_rank/pp_rank/moe_ep_rank (one series per worker when
--enable-metrics-for-all-schedulers is on, all with the same numbers: only the lowest rank
is kept) and dp_rank for data parallelism (summed or averaged across ranks). The hit ratio
comes from the tokenizer's counters: cached_tokens_total / prompt_tokens_total (prompt
tokens include the cached ones).
"""

from __future__ import annotations

from gpuwatch.exposition import common as c
from gpuwatch.exposition.parse import Exposition, wanted_names

PREFIXES = ("sglang:", "process_start_time_seconds")
WANTED = wanted_names((
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "sglang:prompt_tokens",
    "sglang:cached_tokens",
    "sglang:num_retracted_requests",
    "sglang:queue_time_seconds",
    "sglang:max_total_num_tokens",
    "process_start_time_seconds",
))
RANKS = ("tp_rank", "pp_rank", "moe_ep_rank")
GROUP = ("dp_rank",)


def normalize(expo: Exposition, text: str) -> c.Reading:
    r = c.Reading(kind="sglang", generation="sglang")
    names = ("sglang:num_running_reqs", "sglang:prompt_tokens_total")
    r.model = c.model_name(expo, names, "model_name") or c.model_name(expo, names, "name")
    r.ranks = c.count_groups(expo, "sglang:num_running_reqs", GROUP)
    r.start_time = c.start_time(expo)

    c.set_gauge(r, "requests_running", c.REQUESTS_RUNNING, expo, "sglang:num_running_reqs",
                rank_labels=RANKS)
    c.set_gauge(r, "requests_waiting", c.REQUESTS_WAITING, expo, "sglang:num_queue_reqs",
                rank_labels=RANKS)
    r.kv_cache_usage_ratio, why = c.gauge(
        expo, ["sglang:token_usage"], check=c.ratio_value, how="mean", rank_labels=RANKS
    )
    if r.kv_cache_usage_ratio is None:
        r.missing[c.KV_USAGE] = why or "sglang:token_usage " + c.NOT_EXPOSED

    if "sglang:prompt_tokens_total" in expo and "sglang:cached_tokens_total" in expo:
        c.add_counter(r, expo, "sglang:prompt_tokens_total", c.PREFIX_QUERIES, GROUP,
                      rank_labels=RANKS)
        c.add_counter(r, expo, "sglang:cached_tokens_total", c.PREFIX_HITS, GROUP,
                      rank_labels=RANKS)
        r.prefix_unit = "tokens"
    else:
        r.missing[c.PREFIX_CACHE] = "sglang:cached_tokens_total / prompt_tokens_total " + \
            c.NOT_EXPOSED
        rate, _ = c.gauge(expo, ["sglang:cache_hit_rate"], check=c.ratio_value, how="mean",
                          rank_labels=RANKS)
        if rate is not None:
            r.hit_ratio_gauge = rate
            r.hit_ratio_gauge_note = "engine-computed (sglang:cache_hit_rate), not windowed"
        else:
            r.missing[c.KV_HIT_RATIO] = "no prefix-cache metrics in this scrape"

    if not c.add_counter(r, expo, "sglang:num_retracted_requests_total", c.PREEMPTIONS, GROUP,
                         rank_labels=RANKS):
        r.missing[c.PREEMPTION] = "sglang:num_retracted_requests_total " + c.NOT_EXPOSED

    # its KV pool in tokens (summed over data-parallel ranks); SGLang publishes neither its
    # mem_fraction_static nor a sleep state (release_memory_occupation) as metrics
    r.kv_pool_tokens, _ = c.gauge(expo, ["sglang:max_total_num_tokens"], rank_labels=RANKS)
    why = c.add_histogram(r, expo, "sglang:queue_time_seconds", GROUP, rank_labels=RANKS)
    if r.has_counter(c.QUEUE_COUNT):
        r.sli_source["queue"] = "sglang:queue_time_seconds"
    if why:
        r.missing[c.QUEUE_LATENCY] = (
            "sglang:queue_time_seconds " + c.NOT_EXPOSED if why == c.NOT_EXPOSED else why
        )
    return r
