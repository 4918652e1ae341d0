"""What every gpuwatch dashboard shares: panel builders, grid, variables, selectors.

Every panel queries the `${datasource}` variable through a datasource object, has a unit,
and is filtered by the job / instance (and GPU or engine) variables. Uids are fixed so a
re-import replaces the dashboard instead of adding a copy.
"""

from __future__ import annotations

from grafanalib import core as g

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

