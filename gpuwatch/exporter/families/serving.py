"""Serving SLIs per engine and model (DESIGN.md §2): latency histograms on gpuwatch's one bucket
layout, their windowed quantiles and means, tokens, finished requests, requests as clients
were answered, and the error ratio as each side sees it.

Labels engine, kind and model. An engine that serves one model has one row, labelled with
it; one that serves several (Triton) has a row per model. The histograms' buckets are the
engine's own, mapped onto gpuwatch's layout (exposition/layout.py), so that
`histogram_quantile(q, sum by (le, model) (rate(..._bucket[5m])))` holds across hosts,
replicas and engine kinds. An engine with only a sum and a count has only the +Inf bucket:
its mean is right across hosts, and histogram_quantile says NaN rather than a number.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch.exporter.families.engines import LABELS, engine_states
from gpuwatch.exporter.metric import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from gpuwatch.exporter.snapshot import Snapshot

# SLI -> gpuwatch family base, what it measures.
LATENCIES = {
    "queue": ("gpuwatch_engine_queue_latency", "Time requests waited in the engine's queue"),
    "ttft": ("gpuwatch_engine_time_to_first_token",
             "Time from a request's arrival to its first output token"),
    "itl": ("gpuwatch_engine_inter_token_latency",
            "Time between output tokens (per-request TPOT where the engine has only that)"),
    "e2e": ("gpuwatch_engine_e2e_request_latency", "End-to-end request latency"),
    "ptpt": ("gpuwatch_engine_prompt_time_per_token",
             "Time the engine spent per prompt token it processed (llama.cpp)"),
}


def rows(st) -> list[tuple[str, object]]:
    """(model, SLIs) of an engine: its models where it serves several, else itself."""
    if st.models:
        return sorted(st.models.items())
    return [(st.model, st)]


def collect(snap: Snapshot) -> Iterator[Metric]:
    engines = [st for st in engine_states(snap) if st.up and not st.ambiguous]
    if not engines:
        return
    fams: list[Metric] = []
    for sli, (base, what) in LATENCIES.items():
        hist = HistogramMetricFamily(
            base + "_seconds", f"{what}: the engine's buckets on gpuwatch's layout (the +Inf "
            "bucket only where the engine has just a sum and a count).", labels=LABELS)
        # Typed summary (quantiles only, no _count or _sum: those are the histogram's):
        # a gauge with a quantile label is refused by `promtool check metrics`.
        window = Metric(
            base + "_window_seconds", f"{what}: quantiles over gpuwatch's window from the "
            "engine's own bucket increases (a quantile in the engine's first bucket is given "
            "as that bucket's bound; Triton's are its own summaries).", "summary")
        mean = GaugeMetricFamily(base + "_mean_seconds", f"{what}: mean over the window.",
                                 labels=LABELS)
        resolution = GaugeMetricFamily(
            base + "_resolution_seconds", f"{what}: the engine's first bucket bound; a "
            "windowed quantile equal to it is only known to be at most that.", labels=LABELS)
        for st in engines:
            for model, s in rows(st):
                lv = [st.name, st.kind, model]
                _histogram(hist, lv, s, sli)
                for q, v in sorted(s.sli_quantiles_seconds.get(sli, {}).items(),
                                   key=lambda kv: float(kv[0])):
                    window.add_sample(window.name, {**dict(zip(LABELS, lv, strict=True)),
                                                    "quantile": q}, v)
                _add(mean, lv, s.sli_mean_seconds.get(sli))
                _add(resolution, lv, s.sli_resolution_seconds.get(sli))
        fams += [hist, window, mean, resolution]
    fams += list(_counts(engines))
    yield from (f for f in fams if f.samples)


def _histogram(fam: HistogramMetricFamily, lv: list[str], s, sli: str) -> None:
    count, total = s.sli_requests_total.get(sli), s.sli_seconds_total.get(sli)
    if count is None or total is None:
        return
    buckets = s.sli_buckets.get(sli)
    if buckets:
        # here only with an engine's histograms: a host without engines never loads the
        # exposition parsers
        from gpuwatch.exposition.layout import LE_LABELS

        pairs = list(zip(LE_LABELS, buckets, strict=True))
    else:
        pairs = [("+Inf", count)]
    fam.add_metric(lv, pairs, total)


def _counts(engines) -> Iterator[Metric]:
    prompt = CounterMetricFamily("gpuwatch_engine_prompt_tokens",
                                 "Prompt (prefill) tokens, cached ones included.", labels=LABELS)
    generation = CounterMetricFamily("gpuwatch_engine_generation_tokens",
                                     "Generated (output) tokens.", labels=LABELS)
    finished = CounterMetricFamily(
        "gpuwatch_engine_requests_finished",
        "Requests the engine finished, by reason: stop, length, abort, error, ok (the engine "
        "does not say why), other.", labels=[*LABELS, "reason"])
    client = CounterMetricFamily(
        "gpuwatch_engine_client_requests",
        "Requests as the engine's HTTP layer answered them, by outcome: ok, error (4xx and "
        "5xx: refused before the engine counts them too), abort where it counts them.",
        labels=[*LABELS, "outcome"])
    errors = GaugeMetricFamily(
        "gpuwatch_engine_request_error_ratio",
        "Requests that failed / all requests, over the window, as seen by the engine's HTTP "
        "layer (seen_by=\"client\") or its finish reasons (seen_by=\"engine\").",
        labels=[*LABELS, "seen_by"])
    for st in engines:
        for model, s in rows(st):
            lv = [st.name, st.kind, model]
            _add(prompt, lv, s.prompt_tokens_total)
            _add(generation, lv, s.generation_tokens_total)
            for reason, v in sorted(s.requests_finished_total.items()):
                finished.add_metric([*lv, reason], v)
            for outcome, v in sorted(s.client_requests_total.items()):
                client.add_metric([*lv, outcome], v)
            for seen_by, v in sorted(s.request_error_ratios.items()):
                errors.add_metric([*lv, seen_by], v)
    yield from (prompt, generation, finished, client, errors)


def _add(fam, labels: list[str], value: float | None) -> None:
    if value is not None:
        fam.add_metric(labels, value)
