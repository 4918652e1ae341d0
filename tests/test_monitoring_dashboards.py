"""Generated Grafana dashboards: committed output, Grafana's own schema, conventions."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwatch.monitoring import dashboards
from gpuwatch.monitoring.cli import dashboards as dashboards_command
from tests.helpers import REPO

DASH_DIR = REPO / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
UIDS = {
    "gpuwatch-fleet.json": "gpuwatch-fleet",
    "gpuwatch-gpu.json": "gpuwatch-gpu",
    "gpuwatch-engines.json": "gpuwatch-engines",
    "gpuwatch-remediation.json": "gpuwatch-remediation",
    "gpuwatch-workloads.json": "gpuwatch-workloads",
}


def _committed() -> dict[str, dict]:
    return {name: json.loads((DASH_DIR / name).read_text()) for name in UIDS}


def _panels(dash: dict):
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _data_panels(dash: dict):
    return [p for p in _panels(dash) if p["type"] != "row"]


def test_committed_dashboards_match_the_generator(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(dashboards_command, ["-o", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(UIDS)
    for name in UIDS:
        assert (DASH_DIR / name).read_text() == (out / name).read_text(), (
            f"dashboards/{name} drifted from gpuwatch/monitoring/dashboards/: run "
            "`gpuwatch dashboards` and commit the result"
        )


def test_generation_is_deterministic():
    assert dashboards.render() == dashboards.render()


@pytest.fixture(scope="module")
def sdk():
    pytest.importorskip("grafana_foundation_sdk", reason="pip install '.[test]'")
    with warnings.catch_warnings():
        # its legacy dashboard model warns at import; that model is what Grafana imports
        warnings.simplefilter("ignore", DeprecationWarning)
        from grafana_foundation_sdk.cog import plugins
        from grafana_foundation_sdk.models import dashboard

    plugins.register_default_plugins()
    return dashboard


def test_the_sdk_rejects_what_grafana_would_not_take(sdk):
    """The load test has teeth: a string datasource or a null colour fails to load."""
    for breakage in ("datasource", "color"):
        data = json.loads((DASH_DIR / "gpuwatch-gpu.json").read_text())
        panel = _data_panels(data)[0]
        if breakage == "datasource":
            panel["datasource"] = "Prometheus"
        else:
            panel["fieldConfig"]["defaults"]["color"] = None
        with pytest.raises((AttributeError, TypeError)):
            sdk.Dashboard.from_json(data)


@pytest.mark.parametrize("name", sorted(UIDS))
def test_dashboards_load_in_grafana_foundation_sdk(sdk, name):
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import prometheus

    model = sdk
    data = json.loads((DASH_DIR / name).read_text())
    dash = model.Dashboard.from_json(data)
    assert dash.uid == UIDS[name]
    variables = {v.name: v for v in dash.templating.list_val}
    assert variables["datasource"].type_val == "datasource"
    panels = [p for p in dash.panels if not isinstance(p, model.RowPanel)]
    assert len(panels) == len(_data_panels(data))
    for panel in panels:
        # typed all the way down: the panel plugin's options and Prometheus queries
        assert not isinstance(panel.options, dict), panel.title
        assert panel.datasource.type_val == "prometheus" and panel.datasource.uid == "${datasource}"
        assert panel.targets, panel.title
        for target in panel.targets:
            assert isinstance(target, prometheus.Dataquery), panel.title
            assert target.expr and target.ref_id
        assert panel.field_config.defaults.unit, panel.title
    # and it serialises back without errors
    again = json.loads(json.dumps(dash, cls=JSONEncoder))
    assert again["uid"] == UIDS[name]


@pytest.mark.parametrize("name", sorted(UIDS))
def test_every_panel_has_a_unit_a_description_and_datasource_objects(name):
    dash = _committed()[name]
    assert dash["uid"] == UIDS[name]
    panels = _data_panels(dash)
    assert panels
    ids = [p["id"] for p in _panels(dash)]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
        assert p["description"], p["title"]
        assert p["datasource"] == DS, p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DS, p["title"]
    for p in _panels(dash):
        assert p["datasource"] == DS, p["title"]  # rows too: never a datasource string


@pytest.mark.parametrize("name", sorted(UIDS))
def test_panels_do_not_overlap(name):
    cells: dict[tuple[int, int], str] = {}
    for p in _panels(_committed()[name]):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_template_variables():
    expected = {
        "gpuwatch-fleet.json": ["datasource", "job", "instance", "cluster"],
        "gpuwatch-gpu.json": ["datasource", "job", "instance", "gpu"],
        "gpuwatch-engines.json": ["datasource", "job", "instance", "engine", "model"],
        "gpuwatch-remediation.json": ["datasource", "job", "instance"],
        "gpuwatch-workloads.json": ["datasource", "job", "instance", "namespace", "pod"],
    }
    for name, dash in _committed().items():
        variables = dash["templating"]["list"]
        assert [v["name"] for v in variables] == expected[name]
        ds = variables[0]
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"
        for v in variables[1:]:
            assert v["type"] == "query" and v["datasource"] == DS
            assert v["includeAll"] and v["multi"] and v["allValue"] == ".*"
            assert v["query"].startswith("label_values(")


SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}")


@pytest.mark.parametrize("name", sorted(UIDS))
def test_every_selector_follows_the_variables(name):
    """Each series selector is filtered by job and instance (and gpu / engine where the
    dashboard has that variable), so the variables actually narrow every panel."""
    dash = _committed()[name]
    names = {v["name"] for v in dash["templating"]["list"]}
    for p in _data_panels(dash):
        for t in p["targets"]:
            selectors = SELECTOR.findall(t["expr"])
            assert selectors, t["expr"]
            for metric, matchers in selectors:
                if metric.startswith("cluster:"):  # a fleet rule's: no job, no instance left
                    assert 'cluster=~"$cluster"' in matchers, (p["title"], metric)
                    continue
                assert 'job=~"$job"' in matchers and 'instance=~"$instance"' in matchers, (
                    p["title"], metric)
                if "gpu" in names and metric.startswith("gpuwatch_"):
                    assert 'gpu=~"$gpu"' in matchers, (p["title"], metric)
                if "engine" in names:
                    assert 'engine=~"$engine"' in matchers, (p["title"], metric)


def test_memory_panel_draws_the_threshold_lines():
    dash = _committed()["gpuwatch-gpu.json"]
    panel = next(p for p in _data_panels(dash) if p["title"] == "Memory used and thresholds")
    exprs = " ".join(t["expr"] for t in panel["targets"])
    assert "gpuwatch_gpu_memory_threshold_bytes" in exprs
    assert "gpuwatch_gpu_memory_budget_bytes" in exprs
    dashed = [o for o in panel["fieldConfig"]["overrides"]
              if any(pr["id"] == "custom.lineStyle" for pr in o["properties"])]
    assert {o["matcher"]["options"] for o in dashed} >= {".* warning$", ".* critical$",
                                                         ".* budget$"}


def test_hit_ratios_are_ratios_of_summed_counters():
    dash = _committed()["gpuwatch-engines.json"]
    for p in _data_panels(dash):
        for t in p["targets"]:
            assert "avg" not in t["expr"], p["title"]
            for metric in re.findall(r"\b(?:rate|irate|increase)\((\w+)", t["expr"]):
                assert metric.endswith(("_total", "_bucket")), (p["title"], t["expr"])


def test_command_line_imports_neither_grafanalib_nor_yaml():
    code = ("import sys, gpuwatch.monitoring.cli; "
            "print(sorted(m for m in ('grafanalib', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, check=True).stdout
    assert out.strip() == "[]"


def test_gpuwatch_command_has_the_generators(tmp_path):
    """`gpuwatch dashboards` and `gpuwatch alerts` through the real entry point."""
    for args in (["dashboards", "-o", str(tmp_path / "d")], ["alerts", "-o", str(tmp_path / "a")]):
        proc = subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True,
                              text=True, cwd=REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == sorted(UIDS)
    assert (tmp_path / "a" / "gpuwatch.alerts.yml").read_text() == (
        REPO / "alerts" / "gpuwatch.alerts.yml").read_text()


def test_committed_json_is_what_grafana_imports():
    for name, dash in _committed().items():
        assert dash["schemaVersion"] == dashboards.SCHEMA_VERSION
        assert "gpuwatch" in dash["tags"]
        assert Path(DASH_DIR / name).read_text().endswith("\n")
