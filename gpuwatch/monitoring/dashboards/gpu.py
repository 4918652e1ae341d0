"""GPU detail: one GPU's memory against its thresholds, processes, allocator and health."""

from __future__ import annotations

from grafanalib import core as g

from gpuwatch.monitoring.dashboards.panels import (
    DASH,
    DS,
    GPU,
    THROTTLE_MAPPINGS,
    THROTTLE_REASONS,
    ZONE_MAPPINGS,
    Grid,
    by_name,
    by_regex,
    dashboard,
    fixed,
    gauge,
    job_vars,
    query_var,
    stat,
    steps,
    table,
    targets,
    timeseries,
)
from gpuwatch.monitoring.rules import RuleParams


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
