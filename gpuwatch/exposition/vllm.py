"""vLLM, all three metric generations.

- V1 >= 0.9: vllm:kv_cache_usage_perc, vllm:prefix_cache_{queries,hits}_total (tokens).
- V1 <= 0.8: vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_{queries,hits}_total (blocks in
  most releases; the HELP text says which).
- V0: vllm:gpu_cache_usage_perc and the gauge vllm:gpu_prefix_cache_hit_rate (-1 when prefix
  caching is off), label model_name only.
Data-parallel deployments label each engine core `engine="N"`: gauges are summed (requests)
or averaged (KV usage) across them, counters are kept per engine so that one engine core
restarting does not look like a reset of the others.
"""

from __future__ import annotations

import math

from gpuwatch.exposition import common as c
from gpuwatch.exposition.parse import Exposition, help_text, wanted_names

PREFIXES = ("vllm:", "process_start_time_seconds", "http_requests_total")
WANTED = wanted_names((
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_swapped",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits",
    "vllm:gpu_prefix_cache_hit_rate",
    "vllm:num_preemptions",
    "vllm:request_queue_time_seconds",
    "vllm:cache_config_info",
    "vllm:engine_sleep_state",
    "process_start_time_seconds",
))
GROUP = ("engine",)
# cache_config_info labels the memory model reads: the pool share, the KV pool's size
MEMORY_LABELS = frozenset((
    "gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks", "block_size",
    "enable_prefix_caching", "num_gpu_blocks_override",
))
# vllm:engine_sleep_state{sleep_state=...}: awake 0 is asleep; then which level
SLEEP_LEVELS = {"weights_offloaded": 1, "discard_all": 2}


def generation(expo: Exposition) -> str:
    if "vllm:kv_cache_usage_perc" in expo or "vllm:prefix_cache_queries_total" in expo:
        return "v1"
    if "vllm:gpu_prefix_cache_queries_total" in expo:
        return "v1-legacy"
    if "vllm:gpu_prefix_cache_hit_rate" in expo or "vllm:num_requests_swapped" in expo:
        return "v0"
    engines = {c.label(k, "engine") for k in expo.get("vllm:num_requests_running")}
    return "v1-legacy" if engines - {""} else "v0"


def normalize(expo: Exposition, text: str) -> c.Reading:
    gen = generation(expo)
    r = c.Reading(kind="vllm", generation=gen)
    r.model = c.model_name(
        expo, ("vllm:num_requests_running", "vllm:num_requests_waiting"), "model_name"
    )
    r.ranks = c.count_groups(expo, "vllm:num_requests_running", GROUP)
    r.start_time = c.start_time(expo)

    c.set_gauge(r, "requests_running", c.REQUESTS_RUNNING, expo, "vllm:num_requests_running")
    c.set_gauge(r, "requests_waiting", c.REQUESTS_WAITING, expo, "vllm:num_requests_waiting")

    r.kv_cache_usage_ratio, why = c.gauge(
        expo, ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        check=c.ratio_value, how="mean",
    )
    if r.kv_cache_usage_ratio is None:
        r.missing[c.KV_USAGE] = why or "no vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc"

    for key in expo.get("vllm:cache_config_info"):
        # label values come from the engine: keep a bounded copy for /api/state, the labels
        # the memory model reads first (0.32 has 37 labels)
        labels = sorted((kv for kv in key if kv[0] != "engine"),
                        key=lambda kv: (kv[0] not in MEMORY_LABELS, kv[0]))
        r.cache_config = {k[:64]: v[:128] for k, v in labels[:32]}
        break
    _memory(r, expo)

    _prefix_cache(r, expo, text)

    if not c.add_counter(r, expo, "vllm:num_preemptions_total", c.PREEMPTIONS, GROUP):
        r.missing[c.PREEMPTION] = "vllm:num_preemptions_total " + c.NOT_EXPOSED

    why = c.add_histogram(r, expo, "vllm:request_queue_time_seconds", GROUP)
    if r.has_counter(c.QUEUE_COUNT):
        r.sli_source["queue"] = "vllm:request_queue_time_seconds"
    if why:
        r.missing[c.QUEUE_LATENCY] = (
            "vllm:request_queue_time_seconds " + c.NOT_EXPOSED if why == c.NOT_EXPOSED else why
        )
    return r


def _prefix_cache(r: c.Reading, expo: Exposition, text: str) -> None:
    if r.cache_config.get("enable_prefix_caching") == "False":
        off = "prefix caching is off (vllm:cache_config_info enable_prefix_caching=False)"
        r.missing[c.PREFIX_CACHE] = off
        r.missing[c.KV_HIT_RATIO] = off
        return
    for prefix in ("vllm:prefix_cache_", "vllm:gpu_prefix_cache_"):
        q, h = prefix + "queries_total", prefix + "hits_total"
        if q in expo and h in expo:
            c.add_counter(r, expo, q, c.PREFIX_QUERIES, GROUP)
            c.add_counter(r, expo, h, c.PREFIX_HITS, GROUP)
            # vLLM <= 0.8 counted blocks; its HELP text says so.
            doc = help_text(text, q) or help_text(text, q.removesuffix("_total"))
            r.prefix_unit = "blocks" if "block" in doc else "tokens"
            return
    rate, why = c.gauge(
        expo, ["vllm:gpu_prefix_cache_hit_rate"],
        check=lambda v: v if math.isfinite(v) else None, how="mean",
    )
    if rate is not None and rate < 0:
        off = "prefix caching is off (vllm:gpu_prefix_cache_hit_rate is -1)"
        r.missing[c.PREFIX_CACHE] = off
        r.missing[c.KV_HIT_RATIO] = off
        return
    r.missing[c.PREFIX_CACHE] = (
        "vLLM V0 exposes only a hit-rate gauge, no hit/query counters"
        if rate is not None else "no prefix-cache counters in this scrape"
    )
    if rate is not None:
        r.hit_ratio_gauge = c.ratio_value(rate)
        r.hit_ratio_gauge_note = (
            "engine-computed (vllm:gpu_prefix_cache_hit_rate, since start), not windowed"
        )
        if r.hit_ratio_gauge is None:
            r.missing[c.KV_HIT_RATIO] = "vllm:gpu_prefix_cache_hit_rate is out of range"
    else:
        r.missing[c.KV_HIT_RATIO] = why or "no prefix-cache metrics in this scrape"


def _positive(text: str | None) -> float | None:
    try:
        v = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None  # "None" when vLLM sizes it itself
    return v if math.isfinite(v) and 0 < v <= c.COUNTER_MAX else None


def _memory(r: c.Reading, expo: Exposition) -> None:
    """Sleep state and the planned KV pool (tokens: blocks x block size; bytes when the
    operator fixed it with --kv-cache-memory-bytes)."""
    cfg = r.cache_config
    blocks, size = _positive(cfg.get("num_gpu_blocks")), _positive(cfg.get("block_size"))
    if blocks and size and blocks * size <= c.COUNTER_MAX:
        r.kv_pool_tokens = blocks * size
    r.kv_pool_bytes = _positive(cfg.get("kv_cache_memory_bytes"))
    if r.kv_pool_bytes and _positive(cfg.get("num_gpu_blocks_override")):
        # the block count was forced: the pool is those blocks, not the bytes it was given
        # (a 1 GiB kv_cache_memory_bytes next to a 16-block, ~4 MiB pool on the CPU build)
        r.kv_pool_bytes = None
        c.note(r, "kv_cache_memory_bytes is not the KV pool: num_gpu_blocks_override sets it")
    series = expo.get("vllm:engine_sleep_state")
    awake = [v for k, v in series.items() if c.label(k, "sleep_state") == "awake"]
    if not awake or not all(math.isfinite(v) for v in awake):
        return  # older vLLM, or nonsense: unknown
    if all(v >= 0.5 for v in awake):
        r.sleep_level = 0
        return
    # data-parallel ranks sleep together; the deepest level any rank reports wins
    r.sleep_level = max((lvl for k, v in series.items()
                         if v >= 0.5 and (lvl := SLEEP_LEVELS.get(c.label(k, "sleep_state")))),
                        default=1)
