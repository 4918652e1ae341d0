"""Grafana dashboards as code (grafanalib): one function per dashboard.

Every panel queries the `${datasource}` variable through a datasource object, has a unit,
and is filtered by the job / instance (and GPU or engine) variables. Uids are fixed so a
re-import replaces the dashboard instead of adding a copy.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from gpuwatch.monitoring.rules import RuleParams

DS = {"type": "prometheus", "uid": "${datasource}"}
# grafanalib emits schema 12; the panels here are the current kinds, so declare a schema
# recent enough that Grafana runs no legacy migration over them.
SCHEMA_VERSION = 39
TAGS = ["gpuwatch"]
ZONE_MAPPINGS = [{"type": "value", "options": {
    "0": {"text": "safe", "color": "green", "index": 0},
    "1": {"text": "warning", "color": "yellow", "index": 1},
    "2": {"text": "critical", "color": "red", "index": 2},
}}]
UP_MAPPINGS = [{"type": "value", "options": {
    "0": {"text": "down", "color": "red", "index": 0},
    "1": {"text": "up", "color": "green", "index": 1},
}}]
THROTTLE_REASONS = ("sw_power_cap|hw_slowdown|sw_thermal_slowdown|hw_thermal_slowdown|"
                    "hw_power_brake_slowdown")
THROTTLE_MAPPINGS = [{"type": "value", "options": {
    "0": {"text": "-", "color": "transparent", "index": 0},
    "1": {"text": "active", "color": "red", "index": 1},
}}]


def steps(*pairs: tuple[str, float | None]) -> list[dict]:
    """Threshold steps; the first one is the base (value null in Grafana's JSON)."""
    return [{"color": color, "value": value} for color, value in pairs]


BASE = steps(("green", None))


class Grid:
    """Places panels left to right on Grafana's 24-column grid, rows full width."""

    def __init__(self) -> None:
        self.x = self.y = self.line = 0

    def pos(self, w: int, h: int) -> g.GridPos:
        if self.x + w > 24:
            self.x, self.y = 0, self.y + self.line
            self.line = 0
        gp = g.GridPos(h=h, w=w, x=self.x, y=self.y)
        self.x += w
        self.line = max(self.line, h)
        return gp

    def row(self, title: str) -> g.RowPanel:
        self.x, self.y = 0, self.y + self.line
        self.line = 0
        gp = g.GridPos(h=1, w=24, x=0, y=self.y)
        self.y += 1
        return g.RowPanel(title=title, gridPos=gp, dataSource=DS)


def targets(*queries: tuple[str, str], instant: bool = False, table: bool = False):
    return [
        g.Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + i), datasource=DS,
                 instant=instant, format="table" if table else "time_series",
                 intervalFactor=1)
        for i, (expr, legend) in enumerate(queries)
    ]


def timeseries(grid: Grid, title: str, desc: str, queries, unit: str, *, w: int = 12,
               h: int = 8, thresholds=None, threshold_lines: bool = False,
               overrides=(), stack: bool = False, bars: bool = False,
               value_min: int | None = None, value_max: int | None = None,
               interpolation: str = "linear") -> g.TimeSeries:
    return g.TimeSeries(
        title=title, description=desc, dataSource=DS, targets=targets(*queries),
        gridPos=grid.pos(w, h), unit=unit, thresholds=thresholds or BASE,
        thresholdsStyleMode="line" if threshold_lines else "off",
        overrides=list(overrides), legendDisplayMode="table", legendPlacement="right"
        if w >= 16 else "bottom", legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi", tooltipSort="desc", fillOpacity=10 if not bars else 80,
        drawStyle="bars" if bars else "line", lineInterpolation=interpolation,
        stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none"},
        valueMin=value_min, valueMax=value_max, maxDataPoints=None,
    )


def stat(grid: Grid, title: str, desc: str, queries, unit: str, *, w: int = 4, h: int = 4,
         thresholds=None, mappings=(), overrides=(), color_mode: str = "value",
         text_mode: str = "auto", graph: bool = False) -> g.Stat:
    return g.Stat(
        title=title, description=desc, dataSource=DS, targets=targets(*queries),
        gridPos=grid.pos(w, h), format=unit, thresholds=thresholds or BASE,
        color={"mode": "thresholds"}, mappings=list(mappings), overrides=list(overrides),
        colorMode=color_mode, textMode=text_mode, graphMode="area" if graph else "none",
        reduceCalc="lastNotNull", noValue="no data", maxDataPoints=None,
    )


def gauge(grid: Grid, title: str, desc: str, queries, unit: str, *, w: int = 8, h: int = 8,
          thresholds=None, vmin: float = 0, vmax: float = 1) -> g.GaugePanel:
    return g.GaugePanel(
        title=title, description=desc, dataSource=DS, targets=targets(*queries),
        gridPos=grid.pos(w, h), format=unit, thresholds=thresholds or BASE,
        min=vmin, max=vmax, calc="lastNotNull", maxDataPoints=None,
        # grafanalib writes the gauge's options in a pre-7 shape; state the current one
        extraJson={
            "options": {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "orientation": "auto", "showThresholdLabels": False,
                "showThresholdMarkers": True,
            },
            "fieldConfig": {"defaults": {"color": {"mode": "thresholds"}}},
        },
    )


def table(grid: Grid, title: str, desc: str, queries, unit: str, *, w: int = 12,
          h: int = 8, overrides=(), mappings=(), hide=("Time", "__name__", "job"),
          sort: str | None = None, merge: bool = False) -> g.Table:
    transformations = [{"id": "merge", "options": {}}] if merge else []
    transformations.append({"id": "organize", "options": {
        "excludeByName": {name: True for name in hide}, "indexByName": {},
        "renameByName": {},
    }})
    return g.Table(
        title=title, description=desc, dataSource=DS,
        targets=targets(*queries, instant=True, table=True), gridPos=grid.pos(w, h),
        unit=unit, overrides=list(overrides), mappings=list(mappings), filterable=True,
        transformations=transformations, maxDataPoints=None,
        sortBy=[g.TableSortByField(displayName=sort, desc=True)] if sort else [],
        extraJson={"fieldConfig": {"defaults": {"mappings": list(mappings)}}},
    )


def by_name(name: str, **props) -> dict:
    return {"matcher": {"id": "byName", "options": name},
            "properties": [{"id": k.replace("__", "."), "value": v} for k, v in props.items()]}


def by_regex(regex: str, **props) -> dict:
    return {"matcher": {"id": "byRegexp", "options": regex},
            "properties": [{"id": k.replace("__", "."), "value": v} for k, v in props.items()]}


def fixed(color: str) -> dict:
    return {"mode": "fixed", "fixedColor": color}


DASH = {"fill": "dash", "dash": [10, 10]}

# --- template variables ---------------------------------------------------------------


class Template(g.Template):
    """grafanalib's Template, without the keys it would write as null (a datasource
    variable has no datasource of its own; Grafana omits such keys too)."""

    def to_json_data(self):
        return {k: v for k, v in super().to_json_data().items() if v is not None}


def datasource_var() -> g.Template:
    t = Template(name="datasource", label="Data source", query="prometheus",
                   type="datasource", default="default", hide=g.SHOW)
    return t


def query_var(name: str, label: str, query: str) -> g.Template:
    t = Template(name=name, label=label, query=query, dataSource=DS, includeAll=True,
                   multi=True, allValue=".*", refresh=g.REFRESH_ON_TIME_RANGE_CHANGE,
                   sort=g.SORT_ALPHA_ASC)
    # start on "All" (grafanalib would write the literal default text instead)
    t._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return t


def job_vars() -> list[g.Template]:
    return [
        datasource_var(),
        query_var("job", "Job", "label_values(gpuwatch_build_info, job)"),
        query_var("instance", "Instance",
                  'label_values(gpuwatch_build_info{job=~"$job"}, instance)'),
    ]


HOST = 'job=~"$job",instance=~"$instance"'
GPU = HOST + ',gpu=~"$gpu"'
ENGINE = HOST + ',engine=~"$engine",model=~"$model"'


def dashboard(title: str, uid: str, desc: str, variables, panels) -> g.Dashboard:
    return g.Dashboard(
        title=title, uid=uid, description=desc, tags=TAGS, timezone="browser",
        refresh="30s", time=g.Time("now-1h", "now"), schemaVersion=SCHEMA_VERSION,
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR, panels=panels,
        templating=g.Templating(list=variables),
        links=[g.DashboardLink(title="gpuwatch", tags=TAGS, asDropdown=True,
                               includeVars=True, keepTime=True, type="dashboards")],
    ).auto_panel_ids()


# --- dashboards -----------------------------------------------------------------------


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
                     job_vars(), panels)


def gpu_detail(p: RuleParams | None = None) -> g.Dashboard:
    p = p or RuleParams()
    grid = Grid()
    gl = "{{instance}} GPU {{gpu}}"
    pl = "{{instance}} GPU {{gpu}} {{process}} ({{pid}})"
    panels = [
        grid.row("Memory"),
        timeseries(grid, "Memory used and thresholds",
                   "NVML used memory, and the unplanned part of it (used minus engines' "
                   "pre-allocated pools) that the zone judges, against the threshold "
                   "table row of each GPU: warning and critical zones start at the dashed "
                   "lines; budget is the usable memory time to OOM counts down to.",
                   [(f"gpuwatch_gpu_memory_used_bytes{{{GPU}}}", f"{gl} used"),
                    (f"gpuwatch_gpu_memory_unplanned_bytes{{{GPU}}}", f"{gl} unplanned"),
                    (f"gpuwatch_gpu_memory_threshold_bytes{{{GPU}}}", f"{gl} {{{{zone}}}}"),
                    (f"gpuwatch_gpu_memory_budget_bytes{{{GPU}}}", f"{gl} budget"),
                    (f"gpuwatch_gpu_memory_total_bytes{{{GPU}}}", f"{gl} total")],
                   "bytes", w=16, h=9,
                   overrides=[
                       by_regex(".* warning$", custom__lineStyle=DASH,
                                color=fixed("yellow"), custom__fillOpacity=0),
                       by_regex(".* critical$", custom__lineStyle=DASH, color=fixed("red"),
                                custom__fillOpacity=0),
                       by_regex(".* budget$", custom__lineStyle=DASH,
                                color=fixed("purple"), custom__fillOpacity=0),
                       by_regex(".* total$", color=fixed("text"), custom__fillOpacity=0),
                   ]),
        gauge(grid, "Memory budget used",
              "Used memory over the usable budget of the threshold row (spec §6).",
              [(f"gpuwatch_gpu_memory_used_bytes{{{GPU}}}\n/\n"
                f"gpuwatch_gpu_memory_budget_bytes{{{GPU}}}", gl)],
              "percentunit", w=8, h=9,
              thresholds=steps(("green", None), ("yellow", 0.8), ("red", 0.95))),
        stat(grid, "Memory zone", "safe / warning / critical from the threshold table.",
             [(f"gpuwatch_gpu_memory_zone{{{GPU}}}", gl)], "none", w=6, h=8,
             mappings=ZONE_MAPPINGS, color_mode="background", text_mode="value_and_name",
             thresholds=steps(("green", None), ("yellow", 1), ("red", 2))),
        timeseries(grid, "Leak rate",
                   "gpuwatch's robust estimate of the memory the GPU keeps, against a "
                   "plain deriv() of used memory, which also follows warm-up and sawtooth.",
                   [(f"gpuwatch_gpu_memory_leak_rate_bytes_per_second{{{GPU}}}",
                     f"{gl} gpuwatch estimate"),
                    (f"deriv(gpuwatch_gpu_memory_used_bytes{{{GPU}}}[10m])",
                     f"{gl} deriv 10m")], "Bps", w=9, h=8,
                   thresholds=steps(("green", None),
                                    ("yellow", p.leak_warning_bytes_per_second),
                                    ("red", p.leak_critical_bytes_per_second)),
                   threshold_lines=True,
                   overrides=[by_regex(".* deriv 10m$", custom__lineStyle=DASH)]),
        timeseries(grid, "Time to OOM",
                   "Headroom to the budget divided by the leak rate (only while leaking).",
                   [(f"gpuwatch_gpu_time_to_oom_seconds{{{GPU}}}", gl)], "s", w=9, h=8,
                   thresholds=steps(("red", None),
                                    ("yellow", p.time_to_oom_critical_seconds),
                                    ("green", p.time_to_oom_warning_seconds)),
                   threshold_lines=True),
        grid.row("Processes"),
        table(grid, "Processes", "GPU memory and leak rate of every process.",
              [(f"gpuwatch_process_gpu_memory_used_bytes{{{GPU}}}", ""),
               (f"gpuwatch_process_memory_leak_rate_bytes_per_second{{{GPU}}}", "")],
              "bytes", w=24, merge=True, sort="GPU memory",
              overrides=[by_name("Value #A", displayName="GPU memory", unit="bytes"),
                         by_name("Value #B", displayName="Leak rate", unit="Bps")]),
        timeseries(grid, "Process memory", "NVML used memory per process.",
                   [(f"gpuwatch_process_gpu_memory_used_bytes{{{GPU}}}", pl)], "bytes"),
        timeseries(grid, "Process leak rate", "gpuwatch's leak estimate per process.",
                   [(f"gpuwatch_process_memory_leak_rate_bytes_per_second{{{GPU}}}", pl)],
                   "Bps", thresholds=steps(("green", None),
                                           ("yellow", p.leak_warning_bytes_per_second)),
                   threshold_lines=True),
        grid.row("Allocator (in-process probe)"),
        timeseries(grid, "Fragmentation",
                   "Share of the PyTorch allocator's reserved memory held in inactive "
                   "split blocks; processes with the probe only.",
                   [(f"gpuwatch_process_allocator_fragmentation_ratio{{{GPU}}}", pl)],
                   "percentunit", value_min=0, value_max=1,
                   thresholds=steps(("green", None), ("red", p.fragmentation_ratio)),
                   threshold_lines=True),
        timeseries(grid, "Free-memory scatter",
                   "Largest free block over all free memory (healthy at 60 % or more) and "
                   "free blocks per MiB of free memory (healthy at 0.8 or less), spec §4.",
                   [(f"gpuwatch_process_allocator_largest_free_block_bytes{{{GPU}}}\n/\n"
                     f"gpuwatch_process_allocator_free_bytes{{{GPU}}}",
                     f"{pl} largest free share"),
                    (f"gpuwatch_process_allocator_free_blocks{{{GPU}}}\n/\n"
                     f"(gpuwatch_process_allocator_free_bytes{{{GPU}}} / 1048576)",
                     f"{pl} free blocks per MiB")], "none"),
        timeseries(grid, "Allocator memory",
                   "Reserved, allocated and inactive-split bytes, and the largest free "
                   "block, from the probe.",
                   [(f"gpuwatch_process_allocator_reserved_bytes{{{GPU}}}", f"{pl} reserved"),
                    (f"gpuwatch_process_allocator_allocated_bytes{{{GPU}}}",
                     f"{pl} allocated"),
                    (f"gpuwatch_process_allocator_inactive_split_bytes{{{GPU}}}",
                     f"{pl} inactive split"),
                    (f"gpuwatch_process_allocator_largest_free_block_bytes{{{GPU}}}",
                     f"{pl} largest free block")], "bytes", w=24),
        grid.row("Health"),
        stat(grid, "GPU lost", "1 when the driver reports the GPU lost.",
             [(f"gpuwatch_gpu_lost{{{GPU}}}", gl)], "none", w=6,
             mappings=[{"type": "value", "options": {
                 "0": {"text": "ok", "color": "green", "index": 0},
                 "1": {"text": "lost", "color": "red", "index": 1}}}],
             thresholds=steps(("green", None), ("red", 1)), color_mode="background"),
        stat(grid, "XID errors since gpuwatch started",
             "Critical XID events per GPU (0 where none); the code is on the alert.",
             [(f"sum by (instance, gpu) (gpuwatch_gpu_xid_errors_total{{{GPU}}})\nor\n"
               f"sum by (instance, gpu) (0 * gpuwatch_gpu_info{{{GPU}}})", gl)], "none",
             w=6, thresholds=steps(("green", None), ("red", 1)), color_mode="background"),
        stat(grid, "ECC errors (volatile)", "Corrected and uncorrected ECC error counts.",
             [(f"sum by (instance, gpu, type) (gpuwatch_gpu_ecc_errors_total{{{GPU}}})",
               f"{gl} {{{{type}}}}")], "none", w=6,
             thresholds=steps(("green", None), ("red", 1))),
        stat(grid, "Remapped rows", "Rows the GPU remapped, by kind.",
             [(f"gpuwatch_gpu_remapped_rows{{{GPU}}}", f"{gl} {{{{kind}}}}")], "none", w=6),
        g.StateTimeline(
            title="Throttling", description="Clock event reasons that slow the GPU down "
            "(power cap, thermal, hardware slowdown, power brake), while they hold.",
            dataSource=DS, gridPos=grid.pos(24, 8), mappings=THROTTLE_MAPPINGS,
            targets=targets((f"max by (instance, gpu, reason) "
                             f"(gpuwatch_gpu_clocks_event_reasons{{{GPU},"
                             f'reason=~"{THROTTLE_REASONS}"}})', f"{gl} {{{{reason}}}}")),
            thresholds=steps(("green", None), ("red", 1)), maxDataPoints=None,
            extraJson={"fieldConfig": {"defaults": {"unit": "none"}}},
        ),
        stat(grid, "Recovery action", "The driver's recommended recovery action (0 none; "
             "see the runbook for the others).",
             [(f"gpuwatch_gpu_recovery_action{{{GPU}}}", gl)], "none", w=8,
             thresholds=steps(("green", None), ("red", 1)), color_mode="background"),
        stat(grid, "NVLink errors /s", "CRC, replay and recovery errors over all links.",
             [(f"sum by (instance, gpu) "
               f"(rate(gpuwatch_gpu_nvlink_errors_total{{{GPU}}}[5m]))", gl)], "none", w=8,
             thresholds=steps(("green", None), ("orange", 0.1))),
        stat(grid, "Fabric healthy", "1 once NVLink fabric registration completed cleanly "
             "(absent outside NVSwitch systems).",
             [(f"gpuwatch_gpu_fabric_healthy{{{GPU}}}", gl)], "none", w=8,
             thresholds=steps(("red", None), ("green", 1)), color_mode="background"),
        grid.row("Utilization, power, temperature"),
        timeseries(grid, "Utilization", "GPU busy time.",
                   [(f"gpuwatch_gpu_utilization_ratio{{{GPU}}}", gl)], "percentunit", w=8,
                   value_min=0, value_max=1),
        timeseries(grid, "GPM activity", "Hopper and newer: SMs busy, tensor cores busy and "
                   "DRAM bandwidth, over the slow-tier interval.",
                   [(f"gpuwatch_gpu_sm_active_ratio{{{GPU}}}", f"{gl} SM active"),
                    (f"gpuwatch_gpu_tensor_active_ratio{{{GPU}}}", f"{gl} tensor active"),
                    (f"gpuwatch_gpu_dram_bandwidth_utilization_ratio{{{GPU}}}",
                     f"{gl} DRAM bandwidth")], "percentunit", w=8, value_min=0, value_max=1),
        timeseries(grid, "Power", "Board power draw.",
                   [(f"gpuwatch_gpu_power_watts{{{GPU}}}", gl)], "watt", w=8),
        timeseries(grid, "Temperature", "GPU temperature.",
                   [(f"gpuwatch_gpu_temperature_celsius{{{GPU}}}", gl)], "celsius", w=8),
        timeseries(grid, "Clocks", "SM and memory clocks.",
                   [(f"gpuwatch_gpu_sm_clock_hertz{{{GPU}}}", f"{gl} SM"),
                    (f"gpuwatch_gpu_memory_clock_hertz{{{GPU}}}", f"{gl} memory")], "hertz"),
        timeseries(grid, "PCIe throughput", "Slow-tier PCIe counters (sampled over 20 ms).",
                   [(f"gpuwatch_gpu_pcie_tx_bytes_per_second{{{GPU}}}", f"{gl} tx"),
                    (f"gpuwatch_gpu_pcie_rx_bytes_per_second{{{GPU}}}", f"{gl} rx")], "Bps"),
    ]
    variables = [*job_vars(), query_var(
        "gpu", "GPU", 'label_values(gpuwatch_gpu_info{job=~"$job",instance=~"$instance"}, gpu)')]
    return dashboard("gpuwatch / GPU detail", "gpuwatch-gpu",
                     "One GPU in depth: memory against its thresholds, leaks, processes, "
                     "allocator fragmentation and health.", variables, panels)


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
              [(f"gpuwatch_engine_up{{{e}}}", "")], "none", w=18, h=6,
              mappings=UP_MAPPINGS),
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
                   "quantiles over gpuwatch's window of the engine's histogram.",
                   [(f"gpuwatch_engine_queue_latency_seconds{{{e}}}",
                     f"{el} q{{{{quantile}}}}")], "s", w=24,
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
                    (f"gpuwatch_engine_kv_cache_hit_ratio{{{e}}}", f"{el} gpuwatch window")],
                   "percentunit", w=8, value_min=0, value_max=1,
                   thresholds=steps(("red", None), ("green", p.kv_hit_ratio_min)),
                   threshold_lines=True,
                   overrides=[by_regex(".* gpuwatch window$", custom__lineStyle=DASH)]),
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
                     "per engine and model.", variables, panels)


def remediation(p: RuleParams | None = None) -> g.Dashboard:
    grid = Grid()
    r = HOST
    actions = f"gpuwatch_remediation_actions_total{{{r}}}"
    panels = [
        grid.row("Actions"),
        stat(grid, "Failed actions", "Actions that failed in the time range.",
             [(f'sum(increase(gpuwatch_remediation_actions_total{{{r},result="failed"}}'
               f"[$__range])) or vector(0)", "failed")], "none", w=6,
             thresholds=steps(("green", None), ("red", 1))),
        stat(grid, "Actions by result", "Actions in the time range, by result.",
             [(f"sum by (result) (increase({actions}[$__range]))", "{{result}}")],
             "none", w=18, text_mode="value_and_name",
             overrides=[by_name("failed", color=fixed("red")),
                        by_name("ok", color=fixed("green"))]),
        timeseries(grid, "Actions over time", "Actions per interval, by action and result.",
                   [(f"sum by (action, result) (increase({actions}[$__rate_interval]))",
                     "{{action}} {{result}}")], "short", w=24, bars=True, stack=True),
        table(grid, "Actions since gpuwatch started",
              "Counts per host, action and result (from the daemon's counters).",
              [(f"sum by (instance, action, result) ({actions})", "")], "none", w=24,
              sort="Value"),
    ]
    return dashboard("gpuwatch / Remediation", "gpuwatch-remediation",
                     "What gpuwatch's remediation hooks did, by action and result.",
                     job_vars(), panels)


def workloads(p: RuleParams | None = None) -> g.Dashboard:
    """Per Kubernetes pod (and Slurm job): whose workload holds and leaks GPU memory."""
    p = p or RuleParams()
    grid = Grid()
    # only process series carry the owner labels, so only they are filtered by them
    w = HOST + ',namespace=~"$namespace",pod=~"$pod"'
    used = f"gpuwatch_process_gpu_memory_used_bytes{{{w}}}"
    leak = f"gpuwatch_process_memory_leak_rate_bytes_per_second{{{w}}}"
    pod = "{{namespace}}/{{pod}}"
    panels = [
        grid.row("Pods"),
        timeseries(grid, "GPU memory per pod",
                   "NVML used memory of every GPU process of a pod, summed over its "
                   "containers, GPUs and hosts. Processes gpuwatch could not attribute have "
                   "an empty namespace and pod.",
                   [(f"sum by (namespace, pod) ({used})", pod)], "bytes", w=24,
                   stack=True),
        timeseries(grid, "Leak rate per pod",
                   "The fastest leak estimate among a pod's processes.",
                   [(f"max by (namespace, pod) ({leak})", pod)], "Bps",
                   thresholds=steps(("green", None),
                                    ("yellow", p.leak_warning_bytes_per_second)),
                   threshold_lines=True),
        timeseries(grid, "GPUs per pod", "GPUs on which a pod has at least one process.",
                   [(f"count by (namespace, pod) (count by (namespace, pod, instance, uuid) "
                     f"({used}))", pod)], "short"),
        table(grid, "Pod processes",
              "Every GPU process with its pod, container and Slurm job: memory and leak rate.",
              [(used, ""), (leak, "")], "bytes", w=24, merge=True, sort="GPU memory",
              overrides=[by_name("Value #A", displayName="GPU memory", unit="bytes"),
                         by_name("Value #B", displayName="Leak rate", unit="Bps")]),
        grid.row("Slurm jobs"),
        timeseries(grid, "GPU memory per Slurm job",
                   "NVML used memory of the processes of each Slurm job, summed (an empty "
                   "job id: processes outside Slurm).",
                   [(f"sum by (slurm_job_id) (gpuwatch_process_gpu_memory_used_bytes"
                     f"{{{HOST}}})", "job {{slurm_job_id}}")], "bytes", w=24),
    ]
    proc = 'gpuwatch_process_info{job=~"$job",instance=~"$instance"'
    variables = [*job_vars(),
                 query_var("namespace", "Namespace", f"label_values({proc}}}, namespace)"),
                 query_var("pod", "Pod",
                           f'label_values({proc},namespace=~"$namespace"}}, pod)')]
    return dashboard("gpuwatch / Workloads", "gpuwatch-workloads",
                     "GPU memory and leaks per Kubernetes pod and Slurm job.", variables, panels)


DASHBOARDS: dict[str, Callable[[RuleParams | None], g.Dashboard]] = {
    "gpuwatch-fleet.json": fleet_overview,
    "gpuwatch-gpu.json": gpu_detail,
    "gpuwatch-engines.json": inference_engines,
    "gpuwatch-remediation.json": remediation,
    "gpuwatch-workloads.json": workloads,
}


def to_json(dash: g.Dashboard) -> str:
    return json.dumps(dash.to_json_data(), cls=DashboardEncoder, sort_keys=True,
                      indent=2) + "\n"


def render(p: RuleParams | None = None) -> dict[str, str]:
    """File name -> dashboard JSON text."""
    return {name: to_json(build(p)) for name, build in DASHBOARDS.items()}
