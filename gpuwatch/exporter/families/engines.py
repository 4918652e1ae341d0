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


def collect(snap: Snapshot) -> Iterator[Metric]:
    engines = sorted(
        (st for st in snap.derived.engines.values() if isinstance(st, EngineState)),
        key=lambda st: st.name,
    )
    if not engines:
        return
    up = GaugeMetricFamily(
        "gpuwatch_engine_up",
        "1 if the engine's last scrape succeeded and was understood, else 0.",
        labels=LABELS,
    )
    info = GaugeMetricFamily(
        "gpuwatch_engine_info",
        "Engine identity (value 1): the metric generation read and the scraped URL.",
        labels=[*LABELS, "generation", "url"],
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
    # A summary: quantiles over gpuwatch's sliding window (interpolated from the engine's
    # histogram bucket increases as histogram_quantile does), _count/_sum cumulative.
    latency = Metric(
        "gpuwatch_engine_queue_latency_seconds",
        "Time requests waited in the engine's queue: windowed quantiles, cumulative count "
        "and sum.",
        "summary",
    )
    latency_mean = GaugeMetricFamily(
        "gpuwatch_engine_queue_latency_mean_seconds",
        "Mean queue time over the configured window.",
        labels=LABELS,
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
    for st in engines:
        lv = [st.name, st.kind, st.model]
        up.add_metric(lv, 1.0 if st.up else 0.0)
        info.add_metric([*lv, st.generation, st.url], 1.0)
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
        labels = dict(zip(LABELS, lv, strict=True))
        name = "gpuwatch_engine_queue_latency_seconds"
        for q, v in sorted(st.queue_latency_seconds.items(), key=lambda kv: float(kv[0])):
            latency.add_sample(name, {**labels, "quantile": q}, v)
        if st.queue_requests_total is not None and st.queue_seconds_total is not None:
            latency.add_sample(name + "_count", labels, st.queue_requests_total)
            latency.add_sample(name + "_sum", labels, st.queue_seconds_total)
        _add(latency_mean, lv, st.queue_latency_mean_seconds)
        _add(preemptions, lv, st.preemptions_total)
        _add(preemption_rate, lv, st.preemption_rate_per_second)
        _add(sleep, lv, st.sleep_level)
        _add(kv_pool, lv, st.kv_pool_tokens)
    for fam in (up, info, gpu, running, waiting, kv_usage, hits, queries, hit_ratio, latency,
                latency_mean, preemptions, preemption_rate, sleep, kv_pool, scrape):
        if fam.samples:
            yield fam
    yield from sli_families(engines)


def _add(fam, labels: list[str], value: float | None) -> None:
    if value is not None:
        fam.add_metric(labels, value)


# Serving SLIs: gpuwatch name, what it measures.
SLI_FAMILIES = {
    "ttft": ("gpuwatch_engine_time_to_first_token",
             "Time from a request's arrival to its first output token"),
    "itl": ("gpuwatch_engine_inter_token_latency",
            "Time between output tokens (per-request TPOT where the engine has only that)"),
    "e2e": ("gpuwatch_engine_e2e_request_latency", "End-to-end request latency"),
}


def sli_families(engines: list[EngineState]) -> Iterator[Metric]:
    fams: list[Metric] = []
    for sli, (base, what) in SLI_FAMILIES.items():
        name = base + "_seconds"
        summary = Metric(name, f"{what}: quantiles over gpuwatch's window (from the engine's "
                         "histogram bucket increases), cumulative count and sum.", "summary")
        mean = GaugeMetricFamily(base + "_mean_seconds", f"{what}: mean over the window, "
                                 "for engines that expose only a sum and a count.",
                                 labels=LABELS)
        for st in engines:
            labels = dict(zip(LABELS, [st.name, st.kind, st.model], strict=True))
            qs = st.sli_quantiles_seconds.get(sli, {})
            for q, v in sorted(qs.items(), key=lambda kv: float(kv[0])):
                summary.add_sample(name, {**labels, "quantile": q}, v)
            if sli in st.sli_requests_total and sli in st.sli_seconds_total:
                summary.add_sample(name + "_count", labels, st.sli_requests_total[sli])
                summary.add_sample(name + "_sum", labels, st.sli_seconds_total[sli])
            _add(mean, list(labels.values()), st.sli_mean_seconds.get(sli))
        fams += [summary, mean]
    prompt = CounterMetricFamily("gpuwatch_engine_prompt_tokens",
                                 "Prompt (prefill) tokens, cached ones included.", labels=LABELS)
    generation = CounterMetricFamily("gpuwatch_engine_generation_tokens",
                                     "Generated (output) tokens.", labels=LABELS)
    finished = CounterMetricFamily(
        "gpuwatch_engine_requests_finished",
        "Requests finished, by reason: stop, length, abort, error, ok (the engine does not "
        "say why), other.", labels=[*LABELS, "reason"])
    errors = GaugeMetricFamily(
        "gpuwatch_engine_request_error_ratio",
        "Requests finished with an error / all finished requests, over the window.",
        labels=LABELS)
    by_reason = GaugeMetricFamily(
        "gpuwatch_engine_requests_waiting_by_reason",
        "Requests waiting, by the engine's reason (vLLM: capacity, deferred).",
        labels=[*LABELS, "reason"])
    for st in engines:
        lv = [st.name, st.kind, st.model]
        _add(prompt, lv, st.prompt_tokens_total)
        _add(generation, lv, st.generation_tokens_total)
        for reason, v in sorted(st.requests_finished_total.items()):
            finished.add_metric([*lv, reason], v)
        _add(errors, lv, st.request_error_ratio)
        for reason, v in sorted(st.requests_waiting_by_reason.items()):
            by_reason.add_metric([*lv, reason], v)
    fams += [prompt, generation, finished, errors, by_reason]
    yield from (f for f in fams if f.samples)
