"""Remediation: what the hooks did, by action and result."""

from __future__ import annotations

from grafanalib import core as g

from gpuwatch.monitoring.dashboards.panels import (
    HOST,
    Grid,
    by_name,
    dashboard,
    fixed,
    job_vars,
    stat,
    steps,
    table,
    timeseries,
)
from gpuwatch.monitoring.rules import RuleParams


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
