"""The metric names each engine has used, by version: one table per engine, plain data.

Engines rename their metrics (vLLM's gpu_ prefix and TPOT, SGLang's `sglang:` / `sglang_`
separator, NIM's unprefixed copies of vLLM's names), and every rename has broken someone's
dashboards. gpuwatch reads a role (time to first token, KV usage, ...) through this table:
the first name of a role that an exposition has wins, current names before older ones.

Each alias names the change that introduced or removed it and the test fixture (under
tests/fixtures/engines) that carries it. `removed` is the first version without the name:
an exposition of that version or later that still has it contradicts the table, and a
test fails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Alias:
    name: str  # family name as the engine writes it (no _total/_bucket/_sum/_count)
    role: str  # what gpuwatch reads it as (see ROLES)
    since: str = ""  # first version with this name ("" = as far back as gpuwatch knows)
    # first version without it ("" = still exposed; "unknown" = removed in a release the
    # table does not know, so any versioned exposition that has it contradicts the table)
    removed: str = ""
    replaced_by: str = ""
    source: str = ""
    fixture: str = ""  # fixture file that has it
    shape: str = "histogram"  # histogram | counter | gauge | sum (a counter of time)
    count: str = ""  # for shape "sum": the counter of requests it divides by
    scale: float = 1.0  # to base units (seconds)


# What gpuwatch reads; a role without an alias for an engine is reported missing, with why.
ROLES = {
    "ttft": "time to first token",
    "itl": "inter-token latency",
    "tpot": "time per output token (per request)",
    "e2e": "end-to-end request latency",
    "ptpt": "time per prompt token",
    "prompt_tokens": "prompt tokens",
    "generation_tokens": "generated tokens",
    "finished": "finished requests by reason",
    "failed": "failed requests",
    "waiting_by_reason": "waiting requests by reason",
    "client_requests": "HTTP status counter",
    "latency_summary": "the engine's own windowed latency quantiles",
    "server": "server families written with or without a model loaded",
    # read by the engine modules (gpuwatch/exposition/*)
    "running": "running requests",
    "waiting": "waiting requests",
    "kv_usage": "KV-cache usage",
    "prefix_queries": "prefix-cache queries",
    "prefix_hits": "prefix-cache hits",
    "prefix_hit_rate": "engine-computed prefix-cache hit rate",
    "preemptions": "preemptions",
    "queue_time": "queue time",
    "cache_config": "cache configuration",
    "sleep_state": "sleep mode state",
    "kv_pool": "planned KV-cache pool (tokens)",
}

V_PRS = ("vLLM PR #18354 (new names, gpu_ ones deprecated; released in 0.9.2), #24245 "
         "(hidden in 0.11), #29330 (removed in 0.12)")
TPOT_PRS = ("vLLM PR #24110 (TPOT deprecated in 0.11 for ITL), #29330 (hidden in 0.12), "
            "#32661 (removed, for 0.13)")
V_LOGGERS = "vllm/v1/metrics/loggers.py"
V033 = "vllm-0.33.0-statlogger.prom"
V011 = "vllm-0.11-deprecated.prom"
V08 = "vllm-0.8-v1-dp2.prom"
V07 = "vllm-0.7-v0.prom"
NIM_DOC = "NVIDIA NIM for LLMs, Observability (docs.nvidia.com/nim/large-language-models)"
NIM_FIX = "nim-llm-1.x.prom"

VLLM = (
    Alias("vllm:num_requests_running", "running", source=V_LOGGERS, fixture=V033,
          shape="gauge"),
    Alias("vllm:num_requests_waiting", "waiting", source=V_LOGGERS, fixture=V033,
          shape="gauge"),
    Alias("vllm:num_requests_waiting_by_reason", "waiting_by_reason",
          source=V_LOGGERS, fixture=V033, shape="gauge"),
    Alias("vllm:kv_cache_usage_perc", "kv_usage", since="0.9.2", source=V_PRS, fixture=V033,
          shape="gauge"),
    Alias("vllm:gpu_cache_usage_perc", "kv_usage", removed="0.12",
          replaced_by="vllm:kv_cache_usage_perc", source=V_PRS, fixture=V011, shape="gauge"),
    Alias("vllm:prefix_cache_queries", "prefix_queries", since="0.9.2", source=V_PRS,
          fixture=V033, shape="counter"),
    Alias("vllm:prefix_cache_hits", "prefix_hits", since="0.9.2", source=V_PRS, fixture=V033,
          shape="counter"),
    Alias("vllm:gpu_prefix_cache_queries", "prefix_queries", since="0.8", removed="0.12",
          replaced_by="vllm:prefix_cache_queries", source=V_PRS, fixture=V08,
          shape="counter"),
    Alias("vllm:gpu_prefix_cache_hits", "prefix_hits", since="0.8", removed="0.12",
          replaced_by="vllm:prefix_cache_hits", source=V_PRS, fixture=V08, shape="counter"),
    Alias("vllm:gpu_prefix_cache_hit_rate", "prefix_hit_rate", removed="0.10",
          replaced_by="vllm:prefix_cache_hits", source="vLLM PR #14136, #15458, #18837",
          fixture=V07, shape="gauge"),
    Alias("vllm:num_preemptions", "preemptions", source=V_LOGGERS, fixture=V033,
          shape="counter"),
    Alias("vllm:request_queue_time_seconds", "queue_time", source=V_LOGGERS, fixture=V033),
    Alias("vllm:cache_config_info", "cache_config", source=V_LOGGERS, fixture=V033,
          shape="gauge"),
    Alias("vllm:engine_sleep_state", "sleep_state", source=V_LOGGERS, fixture=V033,
          shape="gauge"),
    Alias("vllm:time_to_first_token_seconds", "ttft", source=V_LOGGERS, fixture=V033),
    Alias("vllm:inter_token_latency_seconds", "itl", since="0.11", source=TPOT_PRS,
          fixture=V033),
    # Before 0.11 this name measured the time between iterations, i.e. the ITL.
    Alias("vllm:time_per_output_token_seconds", "itl", removed="0.13",
          replaced_by="vllm:inter_token_latency_seconds", source=TPOT_PRS, fixture=V011),
    Alias("vllm:request_time_per_output_token_seconds", "tpot",
          source="vLLM PR #23919 (per-request TPOT = decode time / decode tokens)",
          fixture=V033),
    Alias("vllm:e2e_request_latency_seconds", "e2e", source=V_LOGGERS, fixture=V033),
    Alias("vllm:prompt_tokens", "prompt_tokens", source=V_LOGGERS, fixture=V033,
          shape="counter"),
    Alias("vllm:generation_tokens", "generation_tokens", source=V_LOGGERS, fixture=V033,
          shape="counter"),
    Alias("vllm:request_success", "finished", source=V_LOGGERS, fixture=V033,
          shape="counter"),
    # Its API server's HTTP layer (prometheus-fastapi-instrumentator, status grouped as
    # 2xx/4xx/5xx): the requests it rejects (400, 404) never reach the engine's counters,
    # and a client that goes away is still a 2xx there (vLLM counts aborts nowhere).
    Alias("http_requests", "client_requests",
          source="vllm/entrypoints/serve/instrumentator/metrics.py",
          fixture="vllm-0.32.0-cpu-real-client.prom", shape="counter"),
    # NIM only (its request_failure_total, read through the NIM renaming below)
    Alias("vllm:request_failure", "failed", source="NIM_REQUEST_FAILURE_TOTAL in NVIDIA "
          "Run:ai's NIM observability metrics", fixture="nim-llm-1.x.prom", shape="counter"),
)

# NIM for LLMs serves vLLM's names without the `vllm:` prefix at /v1/metrics; gpuwatch
# reads them as the vLLM names (NIM_NAMES below), so the vLLM table applies to them.
NIM = tuple(
    Alias(n, role, source=NIM_DOC, fixture=NIM_FIX, shape=shape)
    for n, role, shape in (
        ("num_requests_running", "running", "gauge"),
        ("num_requests_waiting", "waiting", "gauge"),
        ("gpu_cache_usage_perc", "kv_usage", "gauge"),
        ("prompt_tokens", "prompt_tokens", "counter"),
        ("generation_tokens", "generation_tokens", "counter"),
        ("time_to_first_token_seconds", "ttft", "histogram"),
        ("time_per_output_token_seconds", "itl", "histogram"),
        ("e2e_request_latency_seconds", "e2e", "histogram"),
        ("request_success", "finished", "counter"),  # stop or length, no reason label
        ("request_failure", "failed", "counter"),  # any other finish reason
    )
)

SG_DOC = "python/sglang/srt/metrics/collector.py"
SG_SEP = ("SGLang separator flip-flop: #12618, #15758 (sglang_), #33796, #36428 (sglang:); "
          "llm-d #1970")
SG_NEW = "sglang-underscore.prom"
SGLANG = (
    Alias("sglang:num_running_reqs", "running", source=SG_DOC, fixture="sglang.prom",
          shape="gauge"),
    Alias("sglang:num_queue_reqs", "waiting", source=SG_DOC, fixture="sglang.prom",
          shape="gauge"),
    Alias("sglang:token_usage", "kv_usage", source=SG_DOC, fixture="sglang.prom",
          shape="gauge"),
    Alias("sglang:cache_hit_rate", "prefix_hit_rate", source=SG_DOC, fixture="sglang.prom",
          shape="gauge"),
    Alias("sglang:cached_tokens", "prefix_hits", source=SG_DOC, fixture="sglang.prom",
          shape="counter"),
    Alias("sglang:num_retracted_requests", "preemptions", source=SG_DOC,
          fixture="sglang.prom", shape="counter"),
    Alias("sglang:queue_time_seconds", "queue_time", source=SG_DOC, fixture="sglang.prom"),
    Alias("sglang:max_total_num_tokens", "kv_pool", source=SG_DOC, fixture="sglang.prom",
          shape="gauge"),
    Alias("sglang:prompt_tokens", "prompt_tokens", source=SG_DOC, fixture="sglang.prom",
          shape="counter"),
    Alias("sglang:generation_tokens", "generation_tokens", source=SG_DOC,
          fixture="sglang.prom", shape="counter"),
    Alias("sglang:time_to_first_token_seconds", "ttft", source=SG_SEP, fixture=SG_NEW),
    Alias("sglang:inter_token_latency_seconds", "itl", source=SG_SEP, fixture=SG_NEW),
    Alias("sglang:e2e_request_latency_seconds", "e2e", source=SG_SEP, fixture=SG_NEW),
)

LC_DOC = "tools/server/server.cpp (server_task_result_metrics), needs --metrics"
LC_FIX = "llamacpp-0.3.36-real-load.prom"
LLAMACPP = (
    Alias("llamacpp:requests_processing", "running", source=LC_DOC, fixture=LC_FIX,
          shape="gauge"),
    Alias("llamacpp:requests_deferred", "waiting", source=LC_DOC, fixture=LC_FIX,
          shape="gauge"),
    # prompt tokens processed (the cached ones are counted apart, below)
    Alias("llamacpp:prompt_tokens", "prompt_tokens", source=LC_DOC, fixture=LC_FIX,
          shape="counter"),
    Alias("llamacpp:prompt_tokens_cached", "prompt_tokens", source=LC_DOC,
          fixture=LC_FIX, shape="counter"),
    Alias("llamacpp:tokens_predicted", "generation_tokens", source=LC_DOC,
          fixture=LC_FIX, shape="counter"),
    # the time spent decoding over the tokens decoded: the mean inter-token latency (the
    # server's own timings say the same), and the prompt's per processed token
    Alias("llamacpp:tokens_predicted_seconds", "itl", source=LC_DOC, fixture=LC_FIX,
          shape="sum", count="llamacpp:tokens_predicted"),
    Alias("llamacpp:prompt_seconds", "ptpt", source=LC_DOC, fixture=LC_FIX, shape="sum",
          count="llamacpp:prompt_tokens"),
    Alias("llamacpp:kv_cache_usage_ratio", "kv_usage", removed="unknown",
          source="llama.cpp PR #13660 removed the KV-cache gauges (listed in #22879)",
          fixture="", shape="gauge"),
)

TR_DOC = "triton-inference-server docs/user_guide/metrics.md"
TR_REAL = "triton-2.51-pytriton-0.7.0-real-after.prom"
TRT_DOC = "tensorrtllm_backend README (nv_trt_llm_*); llm-d model-servers contract (#546)"
TRITON = (
    Alias("nv_inference_pending_request_count", "waiting", source=TR_DOC,
          fixture="triton-trtllm.prom", shape="gauge"),
    Alias("nv_inference_queue_duration_us", "queue_time", source=TR_DOC,
          fixture="triton-trtllm.prom", shape="sum", count="nv_inference_request_success",
          scale=1e-6),
    Alias("nv_inference_request_duration_us", "e2e", source=TR_DOC,
          fixture="triton-trtllm.prom", shape="sum", count="nv_inference_request_success",
          scale=1e-6),
    Alias("nv_inference_request_success", "finished", source=TR_DOC,
          fixture="triton-trtllm.prom", shape="counter"),
    Alias("nv_inference_request_failure", "failed", source=TR_DOC,
          fixture="triton-trtllm.prom", shape="counter"),
    Alias("nv_inference_request_summary_us", "latency_summary", source=TR_DOC,
          fixture=TR_REAL, shape="summary", scale=1e-6),
    Alias("nv_inference_queue_summary_us", "latency_summary", source=TR_DOC,
          fixture=TR_REAL, shape="summary", scale=1e-6),
    Alias("nv_pinned_memory_pool_total_bytes", "server", source=TR_DOC, fixture=TR_REAL,
          shape="gauge"),
    Alias("nv_cpu_utilization", "server", source=TR_DOC, fixture=TR_REAL, shape="gauge"),
    Alias("nv_trt_llm_request_metrics", "running", source=TRT_DOC,
          fixture="triton-trtllm.prom", shape="gauge"),
    Alias("nv_trt_llm_kv_cache_block_metrics", "kv_usage", source=TRT_DOC,
          fixture="triton-trtllm.prom", shape="gauge"),
)

TG_DOC = ("router/src/server.rs (metrics-exporter-prometheus); "
          "docs/source/reference/metrics.md")
TGI = (
    Alias("tgi_queue_size", "waiting", source=TG_DOC, fixture="tgi.prom", shape="gauge"),
    Alias("tgi_batch_current_size", "running", source=TG_DOC, fixture="tgi.prom",
          shape="gauge"),
    Alias("tgi_request_queue_duration", "queue_time", source=TG_DOC, fixture="tgi.prom"),
    # no time to first token, no inter-token latency: the per-request mean time per token
    Alias("tgi_request_duration", "e2e", source=TG_DOC, fixture="tgi.prom"),
    Alias("tgi_request_mean_time_per_token_duration", "tpot", source=TG_DOC,
          fixture="tgi.prom"),
    # token counts are histograms per request: their _sum is the total
    Alias("tgi_request_input_length", "prompt_tokens", source=TG_DOC, fixture="tgi.prom"),
    Alias("tgi_request_generated_tokens", "generation_tokens", source=TG_DOC,
          fixture="tgi.prom"),
    Alias("tgi_request_success", "finished", source=TG_DOC, fixture="tgi.prom",
          shape="counter"),
    Alias("tgi_request_failure", "failed", source=TG_DOC, fixture="tgi.prom",
          shape="counter"),
    # the router is TGI's HTTP layer: its counters are what clients were answered
    Alias("tgi_request_success", "client_requests", source=TG_DOC, fixture="tgi.prom",
          shape="counter"),
    Alias("tgi_request_failure", "client_requests", source=TG_DOC, fixture="tgi.prom",
          shape="counter"),
)

TABLES: dict[str, tuple[Alias, ...]] = {
    "vllm": VLLM, "nim": NIM, "sglang": SGLANG, "llamacpp": LLAMACPP, "triton": TRITON,
    "tgi": TGI,
}
# Prefixes under which an engine writes its own families (the rest is process_*, python_*).
OWN_PREFIXES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm:",), "sglang": ("sglang:",), "llamacpp": ("llamacpp:",),
    "triton": ("nv_inference_", "nv_trt_llm_"), "tgi": ("tgi_",),
}


def names(kind: str, role: str) -> list[str]:
    """The names of a role for an engine, current before older."""
    found = [a for a in TABLES.get(kind, ()) if a.role == role]
    return [a.name for a in sorted(found, key=lambda a: bool(a.removed))]


def alias(kind: str, name: str) -> Alias | None:
    for a in TABLES.get(kind, ()):
        if a.name == name:
            return a
    return None


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v)[:3])


def removed_in(kind: str, families: set[str], version: str) -> list[str]:
    """Families of an exposition of `version` that the table says are gone by then."""
    v = _version(version)
    return sorted(
        a.name for a in TABLES.get(kind, ())
        if a.removed and a.name in families and v >= _version(a.removed)
    )


# -- reading other dialects as the canonical names -----------------------------------------

NIM_NAMES = {a.name: "vllm:" + a.name for a in NIM}
# Plain str.find/replace (fast C loops), never one regex over a whole body: a long regex
# scan holds the GIL, and the live source reads bodies of megabytes in a worker thread.
_STARTS = ("\n", "\n# HELP ", "\n# TYPE ")


def _has_line(text: str, start: str) -> bool:
    return text.startswith(start) or ("\n" + start) in text


def dialect(text: str) -> str:
    """'sglang_' or 'nim' when the text needs renaming to the canonical names, else ''."""
    if "vllm:" in text or "sglang:" in text:
        return ""
    if _has_line(text, "sglang_"):
        return "sglang_"
    if _has_line(text, "num_requests_running") or _has_line(text, "gpu_cache_usage_perc"):
        return "nim"
    return ""


def _rename(text: str, old: str, new: str) -> str:
    text = "\n" + text  # so that the first line is found like the others
    for start in _STARTS:
        text = text.replace(start + old, start + new)
    return text[1:]


# First line of a compacted exposition that was renamed, so that reading it again (live,
# or in a replay of the recording) still says which dialect the engine wrote.
MARK = "# gpuwatch: renamed from dialect "


def mark(text: str, d: str) -> str:
    return f"{MARK}{d}\n{text}" if d else text


def canonical(text: str) -> tuple[str, str]:
    """(text with the canonical names, the dialect it was written in or '')."""
    if text.startswith(MARK):
        d = text[len(MARK):text.find("\n")]
        return text, d if d in DIALECT_NOTES else ""
    d = dialect(text)
    if d == "sglang_":
        return _rename(text, "sglang_", "sglang:"), d
    if d == "nim":
        for old, new in NIM_NAMES.items():
            text = _rename(text, old, new)
        return text, d
    return text, d


DIALECT_NOTES = {
    "sglang_": "metric names with the sglang_ separator, read as sglang:",
    "nim": "NVIDIA NIM names without the vllm: prefix, read as vLLM's",
}

# -- families gpuwatch does not read --------------------------------------------------------

MAX_FAMILIES = 64  # families listed per engine in /api/state
def family(name: str) -> str:
    for s in ("_total", "_created", "_bucket", "_sum", "_count"):
        if name.endswith(s):
            return name[: -len(s)]
    return name


def declared(text: str, kind: str) -> set[str]:
    """Family names the text declares (# TYPE) under the engine's own prefixes, bounded."""
    own = OWN_PREFIXES.get(kind, ())
    out: set[str] = set()
    head = "# TYPE "
    pos = 0 if text.startswith(head) else text.find("\n" + head)
    pos = pos + 1 if pos > 0 else pos  # the '#' of the line, or -1: none
    while pos >= 0 and len(out) < 4 * MAX_FAMILIES:
        start = pos + len(head)
        end = text.find("\n", start)
        parts = text[start:end if end >= 0 else len(text)][:256].split()
        nxt = text.find("\n" + head, end) if end >= 0 else -1
        pos = nxt + 1 if nxt >= 0 else -1
        if len(parts) < 2 or not parts[0].startswith(own) or len(parts[0]) > 200:
            continue
        name, typ = parts[0], parts[1]
        if name.endswith("_created") and typ == "gauge":
            continue  # prometheus_client's creation timestamps are not families
        out.add(name.removesuffix("_total") if typ == "counter" else name)
    return out


def type_lines(text: str, kind: str) -> list[str]:
    """# TYPE lines to keep in a compacted exposition, so the unread list survives it."""
    return [f"# TYPE {n} untyped" for n in sorted(declared(text, kind))]


def unread(families: set[str], read: set[str]) -> list[str]:
    """Families gpuwatch does not read (a new version's additions show here), bounded."""
    left = sorted(f for f in families if f not in read)
    return left[:MAX_FAMILIES] + ([f"... {len(left) - MAX_FAMILIES} more"]
                                  if len(left) > MAX_FAMILIES else [])
