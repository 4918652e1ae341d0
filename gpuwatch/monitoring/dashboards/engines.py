"""Inference engines: queue, KV cache, preemptions and the serving SLIs per model."""

from __future__ import annotations

from grafanalib import core as g

from gpuwatch.monitoring.dashboards.panels import (
    DASH,
    ENGINE,
    UP_MAPPINGS,
    Grid,
    by_name,
    by_regex,
    dashboard,
    fixed,
    job_vars,
    query_var,
    stat,
    steps,
    table,
    timeseries,
)
from gpuwatch.monitoring.rules import RuleParams


def inference_engines(p: RuleParams | None = None) -> g.Dashboard:
    p = p or RuleParams()
    grid = Grid()
    el = "{{instance}} {{engine}} ({{model}})"
    e = ENGINE

    def hit_ratio(by: str) -> str:
        # a ratio of summed counters, never an average of per-engine ratios
        return (f"sum by ({by}) (rate(gpuwatch_engine_prefix_cache_hits_total{{{e}}}"
                f"[$__rate_interval]))\n/\n"
                f"sum by ({by}) (rate(gpuwatch_engine_prefix_cache_queries_total{{{e}}}"
                f"[$__rate_interval]))")

    panels = [
        grid.row("Engines"),
        stat(grid, "Engines up", "Engines answering their metrics endpoint.",
             [(f"sum(gpuwatch_engine_up{{{e}}}) or vector(0)", "up"),
              (f"count(gpuwatch_engine_up{{{e}}} == 0) or vector(0)", "down")], "none",
             w=6, h=6, text_mode="value_and_name",
             overrides=[by_name("down", color=fixed("red"))]),
        table(grid, "Engines", "Engine, kind and model per host.",
              [(f"gpuwatch_engine_up{{{e}}}", "")], "none", w=12, h=6,
              mappings=UP_MAPPINGS),
        timeseries(grid, "Restarts", "Engine restarts in the interval: a new process start "
                   "time, or counters that went back. Ambiguous: several processes behind "
                   "one URL (nothing is derived from its counters then).",
                   [(f"increase(gpuwatch_engine_restarts_total{{{e}}}[$__rate_interval])",
                     f"{el} restarts"),
                    (f"gpuwatch_engine_ambiguous{{{e}}}", f"{el} ambiguous")],
                   "short", w=6, h=6, bars=True,
                   overrides=[by_regex(".* ambiguous$", color=fixed("red"))]),
        grid.row("Queue"),
        timeseries(grid, "Queue depth", "Requests waiting for a batch slot.",
                   [(f"gpuwatch_engine_requests_waiting{{{e}}}", el)], "short", w=8),
        timeseries(grid, "Running requests", "Requests in the running batch.",
                   [(f"gpuwatch_engine_requests_running{{{e}}}", el)], "short", w=8),
        timeseries(grid, "Queue depth per model", "Waiting requests summed per model.",
                   [(f"sum by (model) (gpuwatch_engine_requests_waiting{{{e}}})",
                     "{{model}}")], "short", w=8),
        timeseries(grid, "Queue latency quantiles",
                   "Time from entering the scheduler queue to the start of execution, "
                   "quantiles over gpuwatch's window of the engine's histogram (one in the "
                   "engine's first bucket is drawn at that bucket's bound: at most that), "
                   "and the mean.",
                   [(f"gpuwatch_engine_queue_latency_window_seconds{{{e}}}",
                     f"{el} q{{{{quantile}}}}"),
                    (f"gpuwatch_engine_queue_latency_mean_seconds{{{e}}}", f"{el} mean")],
                   "s", w=24,
                   thresholds=steps(("green", None), ("red", p.queue_latency_slo_seconds)),
                   threshold_lines=True),
        grid.row("KV cache"),
        timeseries(grid, "KV cache usage", "Share of the KV-cache blocks in use.",
                   [(f"gpuwatch_engine_kv_cache_usage_ratio{{{e}}}", el)], "percentunit",
                   w=8, value_min=0, value_max=1),
        timeseries(grid, "Prefix cache hit ratio per engine",
                   "Hit tokens over queried tokens from the engines' counters; dashed: "
                   "gpuwatch's windowed gauge.",
                   [(hit_ratio("instance, engine, model"), el),
                    (f"gpuwatch_engine_kv_cache_hit_ratio{{{e}}}", f"{el} gpuwatch window"),
                    (f"gpuwatch_engine_kv_cache_hit_ratio_floor{{{e}}}", f"{el} floor")],
                   "percentunit", w=8, value_min=0, value_max=1,
                   overrides=[by_regex(".* gpuwatch window$", custom__lineStyle=DASH),
                              by_regex(".* floor$", color=fixed("red"))]),
        timeseries(grid, "Prefix cache hit ratio per model",
                   "All engines serving a model together (summed counters).",
                   [(hit_ratio("model"), "{{model}}")], "percentunit", w=8,
                   value_min=0, value_max=1),
        timeseries(grid, "Preemptions", "Requests preempted per second (KV-cache pressure).",
                   [(f"sum by (instance, engine, model) "
                     f"(rate(gpuwatch_engine_preemptions_total{{{e}}}[$__rate_interval]))",
                     el)], "ops", w=12),
        timeseries(grid, "Prefix cache queries", "Prompt tokens looked up per second.",
                   [(f"sum by (instance, engine, model) "
                     f"(rate(gpuwatch_engine_prefix_cache_queries_total{{{e}}}"
                     f"[$__rate_interval]))", el)], "ops", w=12),
        *serving_row(grid, p),
    ]
    engine_q = 'gpuwatch_engine_up{job=~"$job",instance=~"$instance"}'
    variables = [
        *job_vars(),
        query_var("engine", "Engine", f"label_values({engine_q}, engine)"),
        query_var("model", "Model",
                  'label_values(gpuwatch_engine_up{job=~"$job",instance=~"$instance",'
                  'engine=~"$engine"}, model)'),
    ]
    return dashboard("gpuwatch / Inference engines", "gpuwatch-engines",
                     "Queue depth and latency, KV-cache usage and hit ratio, preemptions, "
                     "per engine and model; serving SLIs, one row per model.", variables,
                     panels)


def serving_row(grid: Grid, p: RuleParams) -> list:
    """Serving SLIs, one row per model (the row repeats over the model variable)."""
    e = ENGINE
    el = "{{instance}} {{engine}}"
    q = p.sli_quantile
    row = grid.row("Serving: $model")
    row.repeat = g.Repeat(direction="h", variable="model")

    def latency(title: str, desc: str, metric: str, slo: float | None):
        # gpuwatch's window per engine, the mean, and the quantile across every replica of
        # the model from the histograms on gpuwatch's one bucket layout
        per_engine = (f'gpuwatch_engine_{metric}_window_seconds{{{e},quantile=~"0.5|{q}|0.99"}}')
        mean = f"gpuwatch_engine_{metric}_mean_seconds{{{e}}}"
        fleet = (f"histogram_quantile({q}, sum by (le) (rate(gpuwatch_engine_{metric}"
                 f"_seconds_bucket{{{e}}}[$__rate_interval])))")
        return timeseries(grid, title, desc + " Per engine: quantiles over gpuwatch's window "
                          "of the engine's histogram (Triton: its own), and the mean; all "
                          f"replicas: p{float(q) * 100:g} from the histograms.",
                          [(per_engine, f"{el} {{{{quantile}}}}"), (mean, f"{el} mean"),
                           (fleet, f"all replicas p{float(q) * 100:g}")], "s", w=8,
                          thresholds=steps(("green", None), ("red", slo)) if slo else None,
                          threshold_lines=slo is not None,
                          overrides=[by_regex("^all replicas.*", custom__lineWidth=3)])

    def rate(metric: str, by: str, extra: str = "") -> str:
        return (f"sum by ({by}) (rate(gpuwatch_engine_{metric}_total{{{e}{extra}}}"
                f"[$__rate_interval]))")

    def ratio(metric: str, label: str) -> str:
        return rate(metric, "model", f',{label}="error"') + "\n/\n" + rate(metric, "model")

    budget = round(1 - p.availability_objective, 10)
    return [
        row,
        latency("Time to first token", "Arrival to first output token.",
                "time_to_first_token", p.ttft_slo_seconds),
        latency("Inter-token latency", "Time between output tokens (per-request TPOT where "
                "the engine has only that).", "inter_token_latency", None),
        latency("End-to-end request latency", "Arrival to the last token.",
                "e2e_request_latency", p.e2e_slo_seconds),
        timeseries(grid, "Token throughput", "Prompt and generated tokens per second, all "
                   "engines of the model.",
                   [(rate("prompt_tokens", "model"), "prompt"),
                    (rate("generation_tokens", "model"), "generated")], "ops", w=8),
        timeseries(grid, "Finished requests by reason", "Requests finished per second: stop, "
                   "length, abort, error, ok (the engine does not say why), other.",
                   [(rate("requests_finished", "reason"), "{{reason}}")], "reqps", w=8,
                   stack=True, overrides=[by_name("error", color=fixed("red"))]),
        timeseries(grid, "Error ratio", "Failed over all requests, summed counters of the "
                   "model's engines: as clients were answered (the engine's HTTP layer: "
                   "refused requests too) and as the engine finished them.",
                   [(ratio("client_requests", "outcome"), "as clients were answered"),
                    (ratio("requests_finished", "reason"), "as the engine finished them")],
                   "percentunit", w=8, value_min=0,
                   thresholds=steps(("green", None), ("red", budget)), threshold_lines=True),
        timeseries(grid, "Waiting requests by reason", "Why requests wait (vLLM: capacity, "
                   "deferred).",
                   [(f"sum by (reason) (gpuwatch_engine_requests_waiting_by_reason{{{e}}})",
                     "{{reason}}")], "short", w=24, stack=True),
    ]
