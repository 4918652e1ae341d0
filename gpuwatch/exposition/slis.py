"""Serving SLIs from any engine, through the alias table: latency histograms (time to first
token, inter-token, end to end), token counters, finished requests by reason, waiting
requests by reason.

Counters go into Reading.counters (per series group) like the engine modules' own, so they
stay monotonic across engine restarts; histogram buckets are named `<sli>:` + the queue
histogram's bucket names, reusing its code.
"""

from __future__ import annotations

from gpuwatch.exposition import aliases
from gpuwatch.exposition import common as c
from gpuwatch.exposition.parse import Exposition, wanted_names

TTFT, ITL, E2E = "ttft", "itl", "e2e"
PROMPT_TOKEN = "ptpt"  # time per prompt token, where an engine says (llama.cpp)
SLIS = (TTFT, ITL, E2E, PROMPT_TOKEN)
PROMPT_TOKENS = "prompt_tokens"
GENERATION_TOKENS = "generation_tokens"
TOKENS = (PROMPT_TOKENS, GENERATION_TOKENS)
FINISHED = "finished:"  # + reason
FINISHED_REASONS = ("stop", "length", "abort", "error", "ok", "other")
# Requests as the engine's HTTP layer answered them (seen by clients), by outcome.
CLIENT = "client:"  # + outcome
CLIENT_OUTCOMES = ("ok", "error", "abort")
ERROR_RATIO = "request_error_ratio"
CLIENT_ERROR_RATIO = "client_request_error_ratio"
# Prefixes of the counter names this module writes (besides the queue's, unprefixed).
PREFIXES = (*(s + ":" for s in SLIS), FINISHED, CLIENT)
WAITING_BY_REASON = "requests_waiting_by_reason"
# Keys of Reading.missing this module fills.
MISSING_KEYS = (*SLIS, *(s + "_mean" for s in SLIS), *TOKENS, "requests_finished",
                ERROR_RATIO, CLIENT_ERROR_RATIO, WAITING_BY_REASON)
MAX_REASONS = 16  # distinct waiting reasons kept (label values come from the engine)

ROLES = ("ttft", "itl", "tpot", "e2e", "ptpt", "prompt_tokens", "generation_tokens",
         "finished", "failed", "waiting_by_reason", "client_requests")


def key(sli: str, name: str) -> str:
    return f"{sli}:{name}"


def wanted(kind: str) -> frozenset[str]:
    """Sample names this module reads for an engine, besides the engine module's own."""
    bases = [a.name for a in _table(kind)]
    bases += [a.count for a in aliases.TABLES.get(kind, ()) if a.count]
    return wanted_names(bases)


def read_families(kind: str, module_wanted: frozenset[str]) -> set[str]:
    """Families gpuwatch reads for an engine (for the unread list in /api/state)."""
    return {aliases.family(n) for n in module_wanted | wanted(kind)}


def add(r: c.Reading, expo: Exposition, kind: str, group: tuple[str, ...],
        ranks: tuple[str, ...] = ()) -> None:
    table = _table(kind)
    keep = _llm_models(expo) if kind == "triton" else None
    for sli in SLIS:
        _latency(r, expo, table, sli, group, ranks, keep)
    for role in TOKENS:
        found = False
        for a in table:
            # a histogram of tokens per request (TGI) counts them in its _sum
            sample = a.name + ("_sum" if a.shape == "histogram" else "_total")
            if a.role == role and sample in expo:
                # several names may add up (llama.cpp: processed + cached prompt tokens)
                found |= c.add_counter(r, expo, sample, role, group, rank_labels=ranks)
        if not found:
            r.sli_missing[role] = _why_absent(kind, table, role)
    _finished(r, expo, kind, table, group, ranks, keep)
    _client(r, expo, kind, table, group, ranks, keep)
    _waiting(r, expo, kind, table, ranks)


def _table(kind: str) -> list[aliases.Alias]:
    """The aliases read for an engine; per-request TPOT only where it has no ITL."""
    table = [a for a in aliases.TABLES.get(kind, ()) if a.role in ROLES]
    if any(a.role == ITL for a in table):
        table = [a for a in table if a.role != "tpot"]
    return table


def _llm_models(expo: Exposition):
    """With TensorRT-LLM behind Triton, only the LLM model's requests: the ensemble and its
    pre- and post-processing models count every request again (as in triton.py)."""
    llm = {c.label(k, "model") for k in expo.get("nv_trt_llm_request_metrics")}
    return (lambda k: c.label(k, "model") in llm) if llm else None


def _why_absent(kind: str, table: list, role: str) -> str:
    names = [a.name for a in table if a.role == role]
    if not names:
        return f"{kind} exposes no {aliases.ROLES[role]} metric"
    return f"{' / '.join(names)} {c.NOT_EXPOSED}"


def _latency(r: c.Reading, expo: Exposition, table: list, sli: str, group, ranks,
             keep=None) -> None:
    roles = (sli, "tpot") if sli == ITL else (sli,)
    cands = [a for role in roles for a in table if a.role == role]
    why = ""
    for a in cands:
        if a.shape == "histogram":
            tmp = c.Reading(kind=r.kind)
            why = c.add_histogram(tmp, expo, a.name, group, rank_labels=ranks)
            if why:
                continue
            for g, values in tmp.counters.items():
                dst = r.counters.setdefault(g, {})
                for name, v in values.items():
                    dst[key(sli, name)] = v
            r.sli_bounds[sli] = tmp.queue_bounds
            r.sli_source[sli] = a.name + (" (per-request TPOT)" if a.role == "tpot" else "")
            for n in tmp.notes:
                c.note(r, n)
            return
        total, count = _sample(expo, a.name), _sample(expo, a.count)
        if a.shape == "sum" and total and count:
            ok = c.add_counter(r, expo, total, key(sli, c.QUEUE_SUM), group,
                               rank_labels=ranks, scale=a.scale, keep=keep)
            ok &= c.add_counter(r, expo, count, key(sli, c.QUEUE_COUNT), group,
                                rank_labels=ranks, keep=keep)
            if ok:
                r.sli_source[sli] = a.name
                r.sli_missing[sli] = f"{a.name} is a cumulative sum: only the mean is available"
                return
    if not cands:
        r.sli_missing[sli] = f"{r.kind} exposes no {aliases.ROLES[sli]} metric"
    else:
        names = " / ".join(a.name for a in cands)
        r.sli_missing[sli] = f"{names} {c.NOT_EXPOSED}" if not why or why == c.NOT_EXPOSED \
            else why
    r.sli_missing[sli + "_mean"] = r.sli_missing[sli]


def _sample(expo: Exposition, name: str) -> str:
    """The sample name a counter family is written under (prometheus-cpp writes no _total)."""
    if not name:
        return ""
    return name if name in expo else name + "_total" if name + "_total" in expo else ""


def _reason(v: str) -> str:
    return v if v in FINISHED_REASONS else "other"


def _finished(r: c.Reading, expo: Exposition, kind: str, table: list, group, ranks,
              keep=None) -> None:
    found = False
    has_error = False
    for a in table:
        if a.role not in ("finished", "failed"):
            continue
        name = a.name if a.name in expo else a.name + "_total"
        series = expo.get(name)
        if not series:
            continue
        if a.role == "failed":
            # Triton: a cancelled request is an abort, any other failure an error
            for reason in ("abort", "error"):
                found |= c.add_counter(
                    r, expo, name, FINISHED + reason, group, rank_labels=ranks,
                    keep=lambda k, reason=reason: (keep is None or keep(k)) and reason == (
                        "abort" if c.label(k, "reason") == "CANCELED" else "error"))
            has_error = True
            continue
        reasons = {c.label(k, "finished_reason") for k in series}
        if reasons == {""}:
            # the engine counts successes without saying why they ended
            found |= c.add_counter(r, expo, name, FINISHED + "ok", group, rank_labels=ranks,
                                   keep=keep)
            continue
        for reason in {_reason(v) for v in reasons}:
            found |= c.add_counter(
                r, expo, name, FINISHED + reason, group, rank_labels=ranks,
                keep=lambda k, reason=reason: _reason(c.label(k, "finished_reason")) == reason)
        has_error |= "error" in reasons
    if not found:
        r.sli_missing["requests_finished"] = _why_absent(kind, table, "finished")
        r.sli_missing[ERROR_RATIO] = r.sli_missing["requests_finished"]
    elif not has_error:
        r.sli_missing[ERROR_RATIO] = f"{kind} does not count failed requests in this scrape"
    r.counts_errors = has_error


def _outcome(a, key) -> str | None:
    """ok | error | abort of one client-request series, or None to leave it out."""
    if a.name == "http_requests":  # prometheus-fastapi-instrumentator (vLLM)
        if c.label(key, "method") not in ("POST", ""):
            return None  # what clients poll (model lists), not what they ask to be served
        status = c.label(key, "status")[:1]
        return {"2": "ok", "3": "ok", "4": "error", "5": "error"}.get(status)
    if a.name.endswith("_failure"):  # TGI's router: one counter per failure kind
        return "error"
    return "ok"


def _client(r: c.Reading, expo: Exposition, kind: str, table: list, group, ranks,
            keep=None) -> None:
    found = False
    for a in table:
        name = a.name if a.name in expo else a.name + "_total"
        if a.role != "client_requests" or name not in expo:
            continue
        for outcome in CLIENT_OUTCOMES:
            found |= c.add_counter(
                r, expo, name, CLIENT + outcome, group, rank_labels=ranks,
                keep=lambda k, a=a, o=outcome: (keep is None or keep(k)) and _outcome(a, k) == o)
    if not found:
        why = _why_absent(kind, table, "client_requests")
        r.sli_missing[CLIENT_ERROR_RATIO] = why


def _waiting(r: c.Reading, expo: Exposition, kind: str, table: list, ranks) -> None:
    for a in table:
        if a.role != "waiting_by_reason" or a.name not in expo:
            continue
        by: dict[str, float] = {}
        for k, v in c.first_rank(expo.get(a.name), ranks).items():
            reason = c.label(k, "reason")[:64] or "unknown"
            if reason not in by and len(by) >= MAX_REASONS:
                continue
            value = c.count_value(v)
            if value is not None:
                by[reason] = by.get(reason, 0.0) + value
        r.waiting_by_reason = by
        return
    r.sli_missing[WAITING_BY_REASON] = _why_absent(kind, table, "waiting_by_reason")
