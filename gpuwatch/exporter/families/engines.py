"""Inference-engine metrics, the same names whatever engine (DESIGN.md §2).

Labels engine (configured or discovered name), kind and model. A signal an engine does
not provide has no series at all (never 0 or -1); /api/state says why.

The _total counters are the engine's own counts; when the engine restarts, what it had
counted before is kept as an offset, so the series never decreases while the daemon runs
(rate() and increase() then need no reset handling; a daemon restart is an ordinary reset).
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch.exporter.metric import CounterMetricFamily, GaugeMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.signals.derived import EngineState

LABELS = ["engine", "kind", "model"]


def engine_states(snap: Snapshot) -> list[EngineState]:
    return sorted((st for st in snap.derived.engines.values() if isinstance(st, EngineState)),
                  key=lambda st: st.name)


def collect(snap: Snapshot) -> Iterator[Metric]:
    engines = engine_states(snap)
    if not engines:
        return
    up = GaugeMetricFamily(
        "gpuwatch_engine_up",
        "1 if the engine's last scrape succeeded and was understood, else 0.",
        labels=LABELS,
    )
    info = GaugeMetricFamily(
        "gpuwatch_engine_info",
        "Engine identity (value 1): the metric generation read, the scraped URL and the "
        "engine's version where it serves one (empty when unknown).",
        labels=[*LABELS, "generation", "url", "version"],
    )
    restarts = CounterMetricFamily(
        "gpuwatch_engine_restarts",
        "Engine restarts seen: a new process start time, or counters that went back.",
        labels=LABELS,
    )
    ambiguous = GaugeMetricFamily(
        "gpuwatch_engine_ambiguous",
        "1 while the engine's counters go back more than once a window with no start time "
        "to tell processes apart (several processes behind its URL, or a crash loop): no "
        "counter, rate, ratio or latency is derived from it then.",
        labels=LABELS,
    )
    models = GaugeMetricFamily(
        "gpuwatch_engine_models",
        "Models the engine serves now, where it says (Triton); 0 is up with no model loaded.",
        labels=LABELS,
    )
    floor = GaugeMetricFamily(
        "gpuwatch_engine_kv_cache_hit_ratio_floor",
        "The configured KV-cache hit-ratio floor ([signals.kv_cache] floor), where one is set: "
        "the hit-ratio alert compares against it.",
        labels=LABELS,
    )
    gpu = GaugeMetricFamily(
        "gpuwatch_engine_gpu_info",
        "The engine's processes hold memory on this GPU (value 1); joins engine and GPU series.",
        labels=[*LABELS, "gpu", "uuid"],
    )
    running = GaugeMetricFamily(
        "gpuwatch_engine_requests_running", "Requests being executed.", labels=LABELS
    )
    waiting = GaugeMetricFamily(
        "gpuwatch_engine_requests_waiting", "Requests waiting in the queue (queue depth).",
        labels=LABELS,
    )
    kv_usage = GaugeMetricFamily(
        "gpuwatch_engine_kv_cache_usage_ratio", "Share of the KV cache in use (0-1).",
        labels=LABELS,
    )
    hits = CounterMetricFamily(
        "gpuwatch_engine_prefix_cache_hits",
        "Prefix-cache hits in the engine's unit (tokens; blocks for vLLM <= 0.8).",
        labels=[*LABELS, "unit"],
    )
    queries = CounterMetricFamily(
        "gpuwatch_engine_prefix_cache_queries",
        "Prefix-cache queries in the engine's unit (tokens; blocks for vLLM <= 0.8).",
        labels=[*LABELS, "unit"],
    )
    hit_ratio = GaugeMetricFamily(
        "gpuwatch_engine_kv_cache_hit_ratio",
        "Prefix-cache hits / queries over the configured window (0-1); engines without "
        "counters report their own ratio (source=\"engine\").",
        labels=[*LABELS, "source"],
    )
    preemptions = CounterMetricFamily(
        "gpuwatch_engine_preemptions", "Requests preempted (or retracted) by the engine.",
        labels=LABELS,
    )
    preemption_rate = GaugeMetricFamily(
        "gpuwatch_engine_preemption_rate_per_second",
        "Preemptions per second over the configured queue window.",
        labels=LABELS,
    )
    sleep = GaugeMetricFamily(
        "gpuwatch_engine_sleep_level",
        "Sleep mode: 0 awake, 1 weights offloaded, 2 weights and KV cache discarded; while "
        "an engine sleeps (and settles after waking) its memory is not judged a leak.",
        labels=LABELS,
    )
    kv_pool = GaugeMetricFamily(
        "gpuwatch_engine_kv_cache_pool_tokens",
        "Tokens the engine's pre-allocated KV-cache pool holds (vLLM blocks x block size, "
        "SGLang max_total_num_tokens).",
        labels=LABELS,
    )
    scrape = GaugeMetricFamily(
        "gpuwatch_engine_scrape_duration_seconds", "Duration of the last scrape of the engine.",
        labels=LABELS,
    )
    kv_floor = _kv_floor(snap)
    for st in engines:
        lv = [st.name, st.kind, st.model]
        up.add_metric(lv, 1.0 if st.up else 0.0)
        info.add_metric([*lv, st.generation, st.url, st.version], 1.0)
        restarts.add_metric(lv, float(st.restarts_total))
        if st.up:
            ambiguous.add_metric(lv, 1.0 if st.ambiguous else 0.0)
        _add(models, lv, st.models_loaded if st.up else None)
        if kv_floor and st.up and st.prefix_cache_queries_total is not None:
            floor.add_metric(lv, kv_floor)
        for uuid, index in sorted(st.gpus.items()):
            gpu.add_metric([*lv, str(index), uuid], 1.0)
        if st.scrape_duration_seconds is not None:
            scrape.add_metric(lv, st.scrape_duration_seconds)
        _add(running, lv, st.requests_running)
        _add(waiting, lv, st.requests_waiting)
        _add(kv_usage, lv, st.kv_cache_usage_ratio)
        unit = st.prefix_cache_unit or "tokens"
        _add(hits, [*lv, unit], st.prefix_cache_hits_total)
        _add(queries, [*lv, unit], st.prefix_cache_queries_total)
        _add(hit_ratio, [*lv, st.kv_cache_hit_ratio_source], st.kv_cache_hit_ratio)
        _add(preemptions, lv, st.preemptions_total)
        _add(preemption_rate, lv, st.preemption_rate_per_second)
        _add(sleep, lv, st.sleep_level)
        _add(kv_pool, lv, st.kv_pool_tokens)
    by_reason = GaugeMetricFamily(
        "gpuwatch_engine_requests_waiting_by_reason",
        "Requests waiting, by the engine's reason (vLLM: capacity, deferred).",
        labels=[*LABELS, "reason"])
    for st in engines:
        for reason, v in sorted(st.requests_waiting_by_reason.items()):
            by_reason.add_metric([st.name, st.kind, st.model, reason], v)
    for fam in (up, info, restarts, ambiguous, models, gpu, running, waiting, by_reason,
                kv_usage, hits, queries, hit_ratio, floor, preemptions, preemption_rate, sleep,
                kv_pool, scrape):
        if fam.samples:
            yield fam


def _kv_floor(snap: Snapshot) -> float:
    kv = getattr(getattr(snap.config, "signals", None), "kv_cache", None)
    return float(getattr(kv, "floor", 0.0) or 0.0)


def _add(fam, labels: list[str], value: float | None) -> None:
    if value is not None:
        fam.add_metric(labels, value)
