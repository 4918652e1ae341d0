"""Serving SLIs of one engine over the queue window: latency quantiles from bucket increases
(as the queue latency), means where only sums and counts exist, token and finished-request
totals kept monotonic by the engine's counter bank, and the error ratio.

Pure: it reads the normalized Reading and the bank's totals, and keeps its own Window.
"""

from __future__ import annotations

import math

from gpuwatch.exposition import common as c
from gpuwatch.exposition import slis as n
from gpuwatch.signals.derived import EngineState
from gpuwatch.signals.windows import Window, histogram_quantile

# The longest request gpuwatch believes (one day), as for the queue time.
MAX_SECONDS = 86400.0


def qlabel(q: float) -> str:
    return format(q, "g")


def clear(st: EngineState) -> None:
    st.sli_quantiles_seconds = {}
    st.sli_mean_seconds = {}
    st.sli_requests_total = {}
    st.sli_seconds_total = {}
    st.sli_requests_in_window = {}
    st.sli_source = {}
    st.prompt_tokens_total = None
    st.generation_tokens_total = None
    st.requests_finished_total = {}
    st.request_error_ratio = None
    st.requests_waiting_by_reason = {}
    st.unread_families = []


def update(st: EngineState, window: Window, r: c.Reading, totals: dict[str, float],
           t: float, quantiles: list[float]) -> None:
    clear(st)
    st.missing.update(r.sli_missing)
    keep = {k: v for k, v in totals.items()
            if k.startswith(tuple(s + ":" for s in n.SLIS)) or k.startswith(n.FINISHED)}
    window.push(t, keep)
    w = window.seconds
    st.sli_source = dict(r.sli_source)
    st.requests_waiting_by_reason = dict(r.waiting_by_reason)
    st.unread_families = list(r.unread_families)

    def total(name: str) -> float | None:
        v = totals.get(name)
        return v if r.has_counter(name) and v is not None and math.isfinite(v) else None

    st.prompt_tokens_total = total(n.PROMPT_TOKENS)
    st.generation_tokens_total = total(n.GENERATION_TOKENS)
    for reason in n.FINISHED_REASONS:
        v = total(n.FINISHED + reason)
        if v is not None:
            st.requests_finished_total[reason] = v

    for sli in n.SLIS:
        count, ssum = total(n.key(sli, c.QUEUE_COUNT)), total(n.key(sli, c.QUEUE_SUM))
        if count is not None and ssum is not None:
            st.sli_requests_total[sli] = count
            st.sli_seconds_total[sli] = ssum
        bounds = r.sli_bounds.get(sli)
        if bounds:
            _quantiles(st, window, sli, bounds, quantiles, w)
            st.missing.setdefault(sli + "_mean", "the engine has a histogram: see the quantiles")
        else:
            _mean(st, window, sli, w)
    _error_ratio(st, window, r, w)


def _quantiles(st: EngineState, window: Window, sli: str, bounds, quantiles, w) -> None:
    names = [n.key(sli, c.bucket_name(b)) for b in bounds]
    base = window.base(names)
    if base is None:
        st.missing[sli] = "needs a second scrape"
        return
    last = window.latest
    deltas = [max(last[k] - base[1][k], 0.0) for k in names]
    st.sli_requests_in_window[sli] = deltas[-1]
    if deltas[-1] <= 0:
        st.missing[sli] = f"no request in the last {w:g}s"
        return
    out: dict[str, float] = {}
    for q in quantiles:
        v = histogram_quantile(q, bounds, deltas)
        if v is not None and 0 <= v <= MAX_SECONDS:
            out[qlabel(q)] = v
        elif v is not None:
            st.missing[sli] = f"p{q * 100:g} of {v:.3g}s is beyond {MAX_SECONDS:g}s"
    if out:
        st.sli_quantiles_seconds[sli] = out


def _mean(st: EngineState, window: Window, sli: str, w: float) -> None:
    names = [n.key(sli, c.QUEUE_SUM), n.key(sli, c.QUEUE_COUNT)]
    if sli not in st.sli_requests_total:
        return  # the reading says why (missing[sli + "_mean"])
    base = window.base(names)
    if base is None:
        st.missing.setdefault(sli + "_mean", "needs a second scrape")
        return
    last = window.latest
    count = max(last[names[1]] - base[1][names[1]], 0.0)
    seconds = max(last[names[0]] - base[1][names[0]], 0.0)
    st.sli_requests_in_window.setdefault(sli, count)
    mean = seconds / count if count > 0 else None
    if mean is not None and 0 <= mean <= MAX_SECONDS:
        st.sli_mean_seconds[sli] = mean
    else:
        st.missing.setdefault(sli + "_mean", f"no request in the last {w:g}s")


def _error_ratio(st: EngineState, window: Window, r: c.Reading, w: float) -> None:
    if not r.counts_errors or not st.requests_finished_total:
        return  # the reading says why
    names = [n.FINISHED + reason for reason in st.requests_finished_total]
    base = window.base(names)
    if base is None:
        st.missing[n.ERROR_RATIO] = "needs a second scrape"
        return
    last = window.latest
    done = sum(max(last[k] - base[1][k], 0.0) for k in names)
    errors = max(last.get(n.FINISHED + "error", 0.0) - base[1].get(n.FINISHED + "error", 0.0),
                 0.0)
    if done <= 0:
        st.missing[n.ERROR_RATIO] = f"no request finished in the last {w:g}s"
        return
    st.request_error_ratio = min(errors / done, 1.0)
