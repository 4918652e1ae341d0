"""llama.cpp server (tools/server, needs --metrics).

requests_processing / requests_deferred are the running and waiting requests. The KV-cache
gauges (kv_cache_usage_ratio, kv_cache_tokens) were removed upstream: reported only where
an older build still has them. Newer builds count prompt tokens reused from the cache
(prompt_tokens_cached_total) next to the prompt tokens processed without it
(prompt_tokens_total), which gives a hit ratio. There is no queue-time metric.
"""

from __future__ import annotations

from gpuwatch.exposition import common as c
from gpuwatch.exposition.parse import Exposition, wanted_names

PREFIXES = ("llamacpp:",)
WANTED = wanted_names((
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:kv_cache_usage_ratio",
    "llamacpp:prompt_tokens",
    "llamacpp:prompt_tokens_cached",
))
GROUP: tuple[str, ...] = ()


def normalize(expo: Exposition, text: str) -> c.Reading:
    r = c.Reading(kind="llamacpp", generation="llamacpp", ranks=1)
    c.set_gauge(r, "requests_running", c.REQUESTS_RUNNING, expo, "llamacpp:requests_processing")
    c.set_gauge(r, "requests_waiting", c.REQUESTS_WAITING, expo, "llamacpp:requests_deferred")
    r.kv_cache_usage_ratio, why = c.gauge(
        expo, ["llamacpp:kv_cache_usage_ratio"], check=c.ratio_value, how="mean"
    )
    if r.kv_cache_usage_ratio is None:
        r.missing[c.KV_USAGE] = why or (
            "llama.cpp removed its KV-cache gauges from /metrics (per-slot state: GET /slots)"
        )

    cached = expo.get("llamacpp:prompt_tokens_cached_total")
    uncached = expo.get("llamacpp:prompt_tokens_total")
    if cached and uncached:
        # prompt_tokens_total excludes cached tokens: queries = processed + reused.
        c.add_counter(r, expo, "llamacpp:prompt_tokens_total", c.PREFIX_QUERIES, GROUP)
        c.add_counter(r, expo, "llamacpp:prompt_tokens_cached_total", c.PREFIX_QUERIES, GROUP)
        c.add_counter(r, expo, "llamacpp:prompt_tokens_cached_total", c.PREFIX_HITS, GROUP)
        r.prefix_unit = "tokens"
    else:
        why = "this llama.cpp build exposes no llamacpp:prompt_tokens_cached_total"
        r.missing[c.PREFIX_CACHE] = why
        r.missing[c.KV_HIT_RATIO] = why
    r.missing[c.QUEUE_LATENCY] = "llama.cpp exposes no queue-time metric"
    r.missing[c.QUEUE_MEAN] = "llama.cpp exposes no queue-time metric"
    r.missing[c.PREEMPTION] = "llama.cpp exposes no preemption counter"
    return r
