"""Grafana dashboards as code (grafanalib): one module per dashboard.

`panels` holds the conventions every dashboard follows: each panel queries the
`${datasource}` variable through a datasource object, has a unit, and is filtered by the
job / instance (and GPU or engine) variables. Uids are fixed so a re-import replaces the
dashboard instead of adding a copy.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from gpuwatch.monitoring.dashboards.engines import inference_engines, serving_row
from gpuwatch.monitoring.dashboards.fleet import fleet_overview
from gpuwatch.monitoring.dashboards.gpu import gpu_detail
from gpuwatch.monitoring.dashboards.panels import SCHEMA_VERSION
from gpuwatch.monitoring.dashboards.remediation import remediation
from gpuwatch.monitoring.dashboards.workloads import workloads
from gpuwatch.monitoring.rules import RuleParams

__all__ = ["DASHBOARDS", "SCHEMA_VERSION", "fleet_overview", "gpu_detail", "inference_engines",
           "remediation", "render", "serving_row", "to_json", "workloads"]

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
