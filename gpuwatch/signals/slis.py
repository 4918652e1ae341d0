"""Serving SLIs of one engine, or of one of its models, over the queue window.

- latency (queue, ttft, itl, e2e): quantiles from the engine's own bucket increases (as the
  queue latency), the mean from sum and count for every engine that has them, and the
  cumulative counts on gpuwatch's bucket layout (exposition/layout.py) for the exported
  histograms;
- a quantile that falls in the engine's first bucket is only known to be at most that
  bucket's bound (its resolution): it is given as that bound and flagged, never as the
  number interpolation would invent;
- token and finished-request totals kept monotonic by the engine's counter bank, tokens per
  second, and the error ratio as the engine's finish reasons say (seen_by "engine") and as
  its HTTP layer answered clients (seen_by "client").

Pure: it reads the normalized Reading and the bank's totals, and keeps its own Window. The
target is an EngineState (the engine as a whole) or a ModelSlis (one of its models): both
carry the same fields.
"""

from __future__ import annotations

import math

from gpuwatch.exposition import common as c
from gpuwatch.exposition import layout
from gpuwatch.exposition import slis as n
from gpuwatch.signals.windows import Window, histogram_quantile

# The longest request gpuwatch believes (one day), as for the queue time.
MAX_SECONDS = 86400.0
QUEUE = "queue"
LATENCIES = (QUEUE, *n.SLIS)
SEEN_BY = ("engine", "client")


def qlabel(q: float) -> str:
    return format(q, "g")


def counter(sli: str, name: str) -> str:
    """The Reading's counter name of one of a latency's counters (the queue's are unprefixed,
    as the engine modules write them)."""
    return name if sli == QUEUE else n.key(sli, name)


def _windowed(k: str) -> bool:
    return (k.startswith(n.PREFIXES) or k.startswith(c.QUEUE_LE) or k.startswith(c.GW_LE)
            or k in (c.QUEUE_COUNT, c.QUEUE_SUM, *n.TOKENS))


def clear(st) -> None:
    st.sli_quantiles_seconds = {}
    st.sli_quantiles_from_engine = {}
    st.sli_below_resolution = {}
    st.sli_resolution_seconds = {}
    st.sli_mean_seconds = {}
    st.sli_requests_total = {}
    st.sli_seconds_total = {}
    st.sli_buckets = {}
    st.sli_requests_in_window = {}
    st.sli_source = {}
    st.prompt_tokens_total = None
    st.generation_tokens_total = None
    st.prompt_tokens_per_second = None
    st.generation_tokens_per_second = None
    st.requests_finished_total = {}
    st.client_requests_total = {}
    st.request_error_ratio = None
    st.request_error_ratios = {}
    st.requests_waiting_by_reason = {}


def update(st, window: Window, r: c.Reading, totals: dict[str, float],
           t: float, quantiles: list[float], present: set[str] | None = None,
           engine_quantiles: dict[str, dict[str, float]] | None = None) -> None:
    """present: the counter names this target's own groups have in this scrape (a model's),
    None for the whole engine (r.has_counter). engine_quantiles: the engine's own windowed
    quantiles for this target (sli -> label -> seconds), used where it has no histogram."""
    clear(st)
    st.missing.update(r.sli_missing)
    window.push(t, {k: v for k, v in totals.items() if _windowed(k)})
    w = window.seconds
    st.sli_source = dict(r.sli_source)
    if present is None:  # the engine's gauge, not a model's
        st.requests_waiting_by_reason = dict(r.waiting_by_reason)

    def has(name: str) -> bool:
        return name in present if present is not None else r.has_counter(name)

    def total(name: str) -> float | None:
        v = totals.get(name)
        return v if has(name) and v is not None and math.isfinite(v) else None

    st.prompt_tokens_total = total(n.PROMPT_TOKENS)
    st.generation_tokens_total = total(n.GENERATION_TOKENS)
    st.prompt_tokens_per_second = _rate(window, n.PROMPT_TOKENS, st.prompt_tokens_total)
    st.generation_tokens_per_second = _rate(window, n.GENERATION_TOKENS,
                                            st.generation_tokens_total)
    for reason in n.FINISHED_REASONS:
        v = total(n.FINISHED + reason)
        if v is not None:
            st.requests_finished_total[reason] = v
    for outcome in n.CLIENT_OUTCOMES:
        v = total(n.CLIENT + outcome)
        if v is not None:
            st.client_requests_total[outcome] = v
    if st.client_requests_total:
        # an HTTP layer creates its 4xx/5xx series at the first refusal: until then none
        # were answered, and a series born at 1 in Prometheus would hide that first error
        # from rate() (aborts are another matter: most engines cannot count them at all)
        for outcome in ("ok", "error"):
            st.client_requests_total.setdefault(outcome, 0.0)

    bounds_of = {**r.sli_bounds, QUEUE: r.queue_bounds}
    for sli in LATENCIES:
        count = total(counter(sli, c.QUEUE_COUNT))
        ssum = total(counter(sli, c.QUEUE_SUM))
        if count is None or ssum is None:
            continue
        st.sli_requests_total[sli] = count
        st.sli_seconds_total[sli] = ssum
        bounds = bounds_of.get(sli)
        if bounds:
            mapped = [totals.get(counter(sli, c.gw_name(b))) for b in layout.BOUNDS]
            if all(v is not None and math.isfinite(v) for v in mapped):
                st.sli_buckets[sli] = [*mapped, count]
            res = layout.resolution(bounds)
            if res is not None:
                st.sli_resolution_seconds[sli] = res
            _quantiles(st, window, sli, bounds, quantiles, w)
        _mean(st, window, sli, w)
    for sli, given in (engine_quantiles or {}).items():
        wanted = {qlabel(q) for q in quantiles}
        kept = {q: v for q, v in given.items() if q in wanted and 0 <= v <= MAX_SECONDS}
        if kept and sli not in st.sli_quantiles_seconds:
            st.sli_quantiles_seconds[sli] = kept
            st.sli_quantiles_from_engine[sli] = sorted(kept, key=float)
    _error_ratio(st, window, r, w, n.FINISHED, ("error",), "engine", bool(r.counts_errors))
    _error_ratio(st, window, r, w, n.CLIENT, ("error",), "client", bool(st.client_requests_total))
    st.request_error_ratio = st.request_error_ratios.get("engine")


def update_models(st, windows: dict[str, Window], by_model: dict[str, dict[str, float]],
                  r: c.Reading, t: float, quantiles: list[float], seconds: float) -> None:
    """Per-model SLIs, for engines that serve several models (r.model_label): each model
    has its own window, and a model gone from the bank is forgotten."""
    from gpuwatch.signals.derived import ModelSlis

    if not r.model_label:
        st.models = {}
        windows.clear()
        return
    present: dict[str, set[str]] = {}
    engine_q: dict[str, dict[str, dict[str, float]]] = {}
    for group, values in r.counters.items():
        present.setdefault(r.group_models.get(group, ""), set()).update(values)
    for group, qs in r.engine_quantiles.items():
        engine_q.setdefault(r.group_models.get(group, ""), {}).update(qs)
    if r.served_models is not None:  # an unloaded model's series may linger: not served
        present = {m: names for m, names in present.items() if m in r.served_models}
    models = {}
    for model in present:  # the models served now (an unloaded one keeps its totals)
        totals = by_model.get(model, {})
        ms = st.models.get(model) or ModelSlis()
        ms.missing = {}
        window = windows.get(model) or windows.setdefault(model, Window(seconds))
        update(ms, window, r, totals, t, quantiles, present.get(model, set()),
               engine_q.get(model))
        models[model] = ms
    for gone in set(windows) - set(models):
        del windows[gone]
    st.models = models


def _rate(window: Window, name: str, now: float | None) -> float | None:
    if now is None:
        return None
    inc = window.increase(name)
    return inc[0] / inc[1] if inc is not None and inc[1] > 0 else None


def _missing_key(sli: str) -> str:
    return c.QUEUE_LATENCY if sli == QUEUE else sli


def _quantiles(st, window: Window, sli: str, bounds, quantiles, w) -> None:
    names = [counter(sli, c.bucket_name(b)) for b in bounds]
    base = window.base(names)
    miss = _missing_key(sli)
    if base is None:
        st.missing.setdefault(miss, "needs a second scrape")
        return
    last = window.latest
    deltas = [max(last[k] - base[1][k], 0.0) for k in names]
    st.sli_requests_in_window[sli] = deltas[-1]
    if deltas[-1] <= 0:
        st.missing.setdefault(miss, f"no request in the last {w:g}s")
        return
    out: dict[str, float] = {}
    below: list[str] = []
    for q in quantiles:
        v, first = quantile(q, bounds, deltas)
        if v is not None and 0 <= v <= MAX_SECONDS:
            out[qlabel(q)] = v
            if first:
                below.append(qlabel(q))
        elif v is not None:
            st.missing.setdefault(miss, f"p{q * 100:g} of {v:.3g}s is beyond {MAX_SECONDS:g}s")
    if out:
        st.sli_quantiles_seconds[sli] = out
    if below:
        st.sli_below_resolution[sli] = below


def quantile(q: float, bounds, deltas: list[float]) -> tuple[float | None, bool]:
    """(quantile, whether it falls in the engine's first positive bucket). There the
    histogram says only that it is at most that bucket's bound, which is what is given:
    interpolating from 0 would invent a figure (an empty queue read as p95 285 ms from
    buckets that start at 0.3 s)."""
    v = histogram_quantile(q, bounds, deltas)
    res = layout.resolution(bounds)
    if v is None or res is None or not deltas:
        return v, False
    i = list(bounds).index(res)
    below_res = max(deltas[i - 1], 0.0) if i > 0 else 0.0  # observations at <= 0
    rank = q * max(deltas)
    if below_res < rank <= deltas[i]:
        return res, True
    return v, False


def _mean(st, window: Window, sli: str, w: float) -> None:
    names = [counter(sli, c.QUEUE_SUM), counter(sli, c.QUEUE_COUNT)]
    key = (c.QUEUE_MEAN if sli == QUEUE else sli + "_mean")
    base = window.base(names)
    if base is None:
        st.missing.setdefault(key, "needs a second scrape")
        return
    last = window.latest
    count = max(last[names[1]] - base[1][names[1]], 0.0)
    seconds = max(last[names[0]] - base[1][names[0]], 0.0)
    st.sli_requests_in_window.setdefault(sli, count)
    mean = seconds / count if count > 0 else None
    if mean is not None and 0 <= mean <= MAX_SECONDS:
        st.sli_mean_seconds[sli] = mean
    else:
        st.missing.setdefault(key, f"no request in the last {w:g}s")


def _error_ratio(st, window: Window, r: c.Reading, w: float, prefix: str,
                 errors: tuple[str, ...], seen_by: str, counted: bool) -> None:
    """Errors / all requests of one view over the window; the reading says why where the
    engine does not count them."""
    done_by = st.requests_finished_total if prefix == n.FINISHED else st.client_requests_total
    if not counted or not done_by:
        return
    key = n.ERROR_RATIO if seen_by == "engine" else n.CLIENT_ERROR_RATIO
    names = [prefix + k for k in done_by]
    if len(window.snaps) < 2:
        st.missing[key] = "needs a second scrape"
        return
    # A counter absent from the window's first snapshot was born since: engines create a
    # status's or reason's series at its first request (vLLM's 4xx), which is in the window.
    base, last = window.snaps[0][1], window.latest
    done = sum(max(last.get(k, 0.0) - base.get(k, 0.0), 0.0) for k in names)
    bad = sum(max(last.get(prefix + e, 0.0) - base.get(prefix + e, 0.0), 0.0)
              for e in errors)
    if done <= 0:
        st.missing[key] = f"no request finished in the last {w:g}s"
        return
    st.request_error_ratios[seen_by] = min(bad / done, 1.0)
