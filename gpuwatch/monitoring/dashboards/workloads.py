"""Workloads: GPU memory and leaks per Kubernetes pod and Slurm job."""

from __future__ import annotations

from grafanalib import core as g

from gpuwatch.monitoring.dashboards.panels import (
    HOST,
    Grid,
    by_name,
    dashboard,
    job_vars,
    query_var,
    steps,
    table,
    timeseries,
)
from gpuwatch.monitoring.rules import RuleParams


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
