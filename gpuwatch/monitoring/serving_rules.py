"""Serving SLOs as multi-window, multi-burn-rate rules (the SRE workbook's page on 1 h and
5 min at 14.4x the budget, ticket on 6 h and 30 min at 6x), per model across every engine
and replica serving it: time to first token and end-to-end latency from the histograms on
gpuwatch's one bucket layout, errors as clients were answered where the engine's HTTP layer
counts them, else as its finish reasons say.

Each window's alert needs a minimum number of requests in its short window, so one slow
request in an idle window pages nobody; a latency objective the engine's buckets cannot
resolve (its first bucket above the objective) is not judged.
"""

from __future__ import annotations

from gpuwatch.monitoring.rule_base import Alert, Recording, RuleParams, _num

WINDOWS = ("5m", "30m", "1h", "6h")
SECONDS = {"5m": 300, "30m": 1800, "1h": 3600, "6h": 21600}
# (severity, long window, short window, burn rate, for)
BURNS = (("critical", "1h", "5m", 14.4, "2m"), ("warning", "6h", "30m", 6.0, "15m"))
LATENCY_SLOS = (  # sli name in metrics, alert name, what, RuleParams objective attribute
    ("time_to_first_token", "GpuwatchTimeToFirstTokenBudgetBurn", "Time to first token",
     "ttft_slo_seconds"),
    ("e2e_request_latency", "GpuwatchEndToEndLatencyBudgetBurn", "End-to-end request latency",
     "e2e_slo_seconds"),
)
BY = "job, model"


def _le(seconds: float) -> str:
    """The le label the exporter writes for a bound (repr of the float: "2.0")."""
    return repr(float(seconds))


def recording(p: RuleParams) -> list[Recording]:
    j = f'job="{p.job}"'
    out: list[Recording] = []
    for metric, _, _, attr in LATENCY_SLOS:
        base = f"gpuwatch_engine_{metric}_seconds"
        le = _le(getattr(p, attr))
        for w in WINDOWS:
            requests = f"model:gpuwatch_engine_{metric}_requests:rate{w}"
            out.append(Recording(requests, f"sum by ({BY}) (rate({base}_count{{{j}}}[{w}]))"))
            # the share slower than the objective; engines whose first bucket is above it
            # cannot tell, and are left out
            out.append(Recording(
                f"model:gpuwatch_engine_{metric}_slow:ratio_rate{w}",
                f"1 - (\n  sum by ({BY}) (rate({base}_bucket{{{j},le=\"{le}\"}}[{w}]))\n"
                f"  /\n  ({requests}{{{j}}} > 0)\n)\n"
                f"unless on ({BY})\n"
                f"(max by ({BY}) (gpuwatch_engine_{metric}_resolution_seconds{{{j}}}) > {le})"))
    for w in WINDOWS:
        client = f"gpuwatch_engine_client_requests_total{{{j}}}"
        finished = f"gpuwatch_engine_requests_finished_total{{{j}}}"
        out.append(Recording(
            f"model:gpuwatch_engine_requests:rate{w}",
            f"sum by ({BY}) (rate({client}[{w}]))\nor\n"
            f"sum by ({BY}) (rate({finished}[{w}]))"))
        # as clients were answered where the HTTP layer counts, else the finish reasons
        out.append(Recording(
            f"model:gpuwatch_engine_request_errors:ratio_rate{w}",
            f"(\n  sum by ({BY}) (rate(gpuwatch_engine_client_requests_total"
            f"{{{j},outcome=\"error\"}}[{w}]))\n"
            f"  /\n  (sum by ({BY}) (rate({client}[{w}])) > 0)\n)\nor\n(\n"
            f"  sum by ({BY}) (rate(gpuwatch_engine_requests_finished_total"
            f"{{{j},reason=\"error\"}}[{w}]))\n"
            f"  /\n  (sum by ({BY}) (rate({finished}[{w}])) > 0)\n)"))
    return out


def _burn(name: str, ratio: str, requests: str, budget: float, j: str, what: str,
          objective: str, p: RuleParams) -> list[Alert]:
    out = []
    for severity, long_w, short_w, rate, for_ in BURNS:
        limit = _num(round(rate * budget, 10))
        out.append(Alert(
            name,
            f"{ratio}:ratio_rate{long_w}{{{j}}} > {limit}\nand\n"
            f"{ratio}:ratio_rate{short_w}{{{j}}} > {limit}\nand on ({BY})\n"
            f"{requests}:rate{short_w}{{{j}}} * {SECONDS[short_w]} >= "
            f"{_num(p.slo_min_requests)}",
            severity,
            f"{what} burns its error budget {'fast' if severity == 'critical' else 'steadily'}.",
            f"{{{{ $value | humanizePercentage }}}} of the requests to model "
            f"{{{{ $labels.model }}}} over {long_w} missed the objective ({objective}), "
            f"{_num(rate)} times the {_pct(budget)} budget, and still do over {short_w}.",
            for_))
    return out


def _pct(x: float) -> str:
    return f"{_num(round(100 * x, 6))} %"


def alerts(p: RuleParams, j: str, eng: str) -> list[Alert]:
    """Serving SLOs per model (burn rates), and the queue time per engine."""
    out: list[Alert] = []
    budget = round(1 - p.latency_objective, 10)
    for metric, name, what, attr in LATENCY_SLOS:
        objective = (f"{_num(100 * p.latency_objective)} % within "
                     f"{_num(getattr(p, attr))} s")
        out += _burn(name, f"model:gpuwatch_engine_{metric}_slow",
                     f"model:gpuwatch_engine_{metric}_requests", budget, j, what, objective, p)
    errors = round(1 - p.availability_objective, 10)
    out += _burn("GpuwatchEngineErrorBudgetBurn", "model:gpuwatch_engine_request_errors",
                 "model:gpuwatch_engine_requests", errors, j, "The request error ratio",
                 f"{_num(100 * p.availability_objective)} % without an error", p)
    return out


def queue_alert(p: RuleParams, j: str, eng: str) -> Alert:
    """The windowed queue-time quantile over its objective, on enough requests, and never
    where the quantile lies in the engine's first bucket (known only to be below it)."""
    q = p.queue_latency_quantile
    on = "job, instance, engine, kind, model"
    window = f'gpuwatch_engine_queue_latency_window_seconds{{{j},quantile="{q}"}}'
    return Alert(
        "GpuwatchQueueLatencyHigh",
        f"{window} > {_num(p.queue_latency_slo_seconds)}\n"
        f"and on ({on})\nincrease(gpuwatch_engine_queue_latency_seconds_count{{{j}}}[5m]) >= "
        f"{_num(p.queue_min_requests)}\n"
        f"unless on ({on})\n{window}\n  <= on ({on})\n"
        f"  gpuwatch_engine_queue_latency_resolution_seconds{{{j}}}",
        "warning", "Requests wait too long in an engine's queue.",
        f"The {q} quantile of queue time of {eng} is "
        "{{ $value | humanizeDuration }}, above the "
        f"{_num(p.queue_latency_slo_seconds)} s objective.", "10m")


def kv_alert(p: RuleParams, j: str, eng: str) -> Alert:
    """Below the floor the daemon is configured with ([signals.kv_cache] floor): where the
    floor is off, the daemon exports none and the alert cannot fire."""
    on = "job, instance, engine, kind, model"
    return Alert(
        "GpuwatchKvCacheHitRatioLow",
        f"instance_engine:gpuwatch_engine_prefix_cache_hit:ratio_rate5m{{{j}}}\n"
        f"< on ({on})\ngpuwatch_engine_kv_cache_hit_ratio_floor{{{j}}}\nand on ({on})\n"
        f"instance_engine:gpuwatch_engine_prefix_cache_queries:rate5m{{{j}}} > "
        f"{_num(p.kv_min_queries_per_second)}", "warning",
        "The prefix (KV) cache hit ratio is below its floor.",
        f"Only {{{{ $value | humanizePercentage }}}} of the prompt tokens of {eng} "
        "were served from the prefix cache over 5 minutes, for 15 minutes, below the floor "
        "the daemon is configured with.", "15m")
