"""Fleet overview: every host's zones, leaks, time to OOM and engines."""

from __future__ import annotations

from grafanalib import core as g

from gpuwatch.monitoring.dashboards.panels import (
    HOST,
    UP_MAPPINGS,
    Grid,
    by_name,
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


def fleet_overview(p: RuleParams | None = None) -> g.Dashboard:
    p = p or RuleParams()
    grid = Grid()
    h = HOST
    panels = [
        grid.row("Fleet"),
        stat(grid, "Hosts up", "gpuwatch exporters Prometheus scraped successfully.",
             [(f"count(up{{{h}}} == 1) or vector(0)", "up")], "none"),
        stat(grid, "Hosts down", "gpuwatch exporters Prometheus could not scrape.",
             [(f"count(up{{{h}}} == 0) or vector(0)", "down")], "none",
             thresholds=steps(("green", None), ("red", 1))),
        stat(grid, "GPUs", "GPUs the exporters report.",
             [(f"count(gpuwatch_gpu_info{{{h}}}) or vector(0)", "GPUs")], "none"),
        stat(grid, "GPUs per memory zone",
             "Zones from the threshold table row each GPU matches.",
             [(f"count(gpuwatch_gpu_memory_zone{{{h}}} == {z}) or vector(0)", name)
              for z, name in enumerate(("safe", "warning", "critical"))],
             "none", w=6, text_mode="value_and_name",
             overrides=[by_name("safe", color=fixed("green")),
                        by_name("warning", color=fixed("yellow")),
                        by_name("critical", color=fixed("red"))]),
        stat(grid, "Hosts without NVML", "Exporters that cannot read the driver.",
             [(f"count(gpuwatch_nvml_up{{{h}}} == 0) or vector(0)", "NVML down")], "none",
             w=3, thresholds=steps(("green", None), ("red", 1))),
        stat(grid, "Engines up", "Inference engines answering their metrics endpoint.",
             [(f"sum(gpuwatch_engine_up{{{h}}}) or vector(0)", "up"),
              (f"count(gpuwatch_engine_up{{{h}}} == 0) or vector(0)", "down")], "none",
             w=3, text_mode="value_and_name",
             overrides=[by_name("down", color=fixed("red"))]),
        grid.row("Memory"),
        timeseries(grid, "GPU memory used per host",
                   "Used over total memory of every GPU of a host (a ratio of sums).",
                   [(f"sum by (instance) (gpuwatch_gpu_memory_used_bytes{{{h}}})\n/\n"
                     f"sum by (instance) (gpuwatch_gpu_memory_total_bytes{{{h}}})",
                     "{{instance}}")], "percentunit", value_min=0, value_max=1),
        timeseries(grid, "Top GPU leak rates",
                   "gpuwatch's robust leak estimate per GPU (warm-up and allocator "
                   "sawtooth excluded), the ten highest.",
                   [(f"topk(10, gpuwatch_gpu_memory_leak_rate_bytes_per_second{{{h}}})",
                     "{{instance}} GPU {{gpu}}")], "Bps",
                   thresholds=steps(("green", None),
                                    ("yellow", p.leak_warning_bytes_per_second)),
                   threshold_lines=True),
        table(grid, "Top process leak rates", "Processes whose kept GPU memory grows "
              "fastest (gpuwatch's estimate).",
              [(f"topk(10, gpuwatch_process_memory_leak_rate_bytes_per_second{{{h}}})", "")],
              "Bps", sort="Value"),
        table(grid, "Shortest time to OOM",
              "Headroom to the memory budget divided by the leak rate, shortest first.",
              [(f"bottomk(10, gpuwatch_gpu_time_to_oom_seconds{{{h}}})", "")], "s",
              hide=("Time", "__name__", "job", "pci_bus_id")),
        grid.row("Engines"),
        table(grid, "Engines", "Every inference engine gpuwatch reads.",
              [(f"gpuwatch_engine_up{{{h}}}", "")], "none", mappings=UP_MAPPINGS),
        timeseries(grid, "Requests waiting per model",
                   "Queue depth summed over the engines serving each model.",
                   [(f"sum by (model) (gpuwatch_engine_requests_waiting{{{h}}})",
                     "{{model}}")], "short"),
        grid.row("Clusters"),
        *cluster_panels(grid, p),
        grid.row("Agents"),
        table(grid, "gpuwatch versions and threshold tables",
              "Exporter build and the threshold table version it judges GPUs against.",
              [(f"gpuwatch_build_info{{{h}}}", ""),
               (f"gpuwatch_threshold_table_info{{{h}}}", "")], "none",
              hide=("Time", "__name__", "job", "Value #A", "Value #B"), merge=True),
        timeseries(grid, "Collection time per source",
                   "How long each source took on its last collection.",
                   [(f"max by (instance, source) (gpuwatch_collect_duration_seconds{{{h}}})",
                     "{{instance}} {{source}}")], "s"),
    ]
    return dashboard("gpuwatch / Fleet overview", "gpuwatch-fleet",
                     "Every GPU host gpuwatch watches: zones, leaks, time to OOM, engines.",
                     [*job_vars(), cluster_var(p)], panels)


def cluster_var(p: RuleParams):
    """The clusters the central Prometheus's fleet rules know (empty on an edge one)."""
    c = p.cluster_label
    return query_var(c, "Cluster", f"label_values({c}:gpuwatch_hosts:count, {c})")


def cluster_panels(grid: Grid, p: RuleParams) -> list:
    """From the fleet recording rules (alerts/gpuwatch.fleet.rules.yml): one series per
    cluster, whatever the number of hosts behind it."""
    c = p.cluster_label
    legend = f"{{{{{c}}}}}"
    sel = f'{{{c}=~"${c}"}}'  # these series have no job or instance: the cluster narrows them
    return [
        timeseries(grid, "GPUs with a leak verdict",
                   "GPUs whose own memory or one of whose processes gpuwatch judges leaking, "
                   "per cluster.",
                   [(f"{c}:gpuwatch_gpus_with_leak_verdict:count{sel} or vector(0)", legend)],
                   "none", w=8, value_min=0),
        timeseries(grid, "Shortest time to OOM per cluster",
                   "The GPU closest to its memory budget at its leak rate, per cluster.",
                   [(f"{c}:gpuwatch_gpu_time_to_oom_seconds:min{sel}", legend)], "s", w=8,
                   thresholds=steps(("red", None), ("yellow", p.time_to_oom_critical_seconds),
                                    ("green", p.time_to_oom_warning_seconds)),
                   threshold_lines=True),
        timeseries(grid, "Series per host",
                   "The largest gpuwatch exposition of a host per cluster (the series "
                   "budget), and the cluster's hosts.",
                   [(f"{c}:gpuwatch_exposition_series_per_host:max{sel}",
                     f"{legend} max per host"),
                    (f"{c}:gpuwatch_hosts:count{sel}", f"{legend} hosts")], "short", w=8),
    ]
