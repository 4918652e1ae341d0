"""Generated Prometheus rules: committed output, promtool, conventions, tests, runbook."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuwatch.monitoring import rules
from gpuwatch.monitoring.cli import alerts as alerts_command
from tests.helpers import REPO, require_binary

ALERTS_DIR = REPO / "alerts"
TESTS_DIR = ALERTS_DIR / "tests"
RUNBOOK = REPO / "docs" / "runbook.md"


def _generate(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "out"
    result = CliRunner().invoke(alerts_command, ["-o", str(out), *args])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("fmt", rules.FORMATS)
def test_committed_rules_match_the_generator(tmp_path, fmt):
    out = _generate(tmp_path, "--format", fmt)
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(rules.render(rules.RuleParams(), fmt))
    for name in written:
        committed = ALERTS_DIR / name
        assert committed.exists(), f"{committed} missing: run `gpuwatch alerts --format {fmt}`"
        assert committed.read_text() == (out / name).read_text(), (
            f"{committed} drifted from gpuwatch/monitoring/rules.py: run "
            f"`gpuwatch alerts --format {fmt}` and commit the result"
        )


def test_promtool_accepts_the_rules_and_the_prometheusrule_spec(tmp_path):
    promtool = require_binary("promtool")
    spec = yaml.safe_load((ALERTS_DIR / rules.PROMETHEUSRULE_FILE).read_text())
    assert spec["kind"] == "PrometheusRule"
    assert spec["apiVersion"] == "monitoring.coreos.com/v1"
    from_crd = tmp_path / "from-crd.yml"
    from_crd.write_text(yaml.safe_dump({"groups": spec["spec"]["groups"]}))
    files = [ALERTS_DIR / rules.RULES_FILE, ALERTS_DIR / rules.ALERTS_FILE, from_crd]
    proc = subprocess.run([promtool, "check", "rules", *map(str, files)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the custom resource holds exactly the two rule files' groups
    plain = [g for f in files[:2] for g in yaml.safe_load(f.read_text())["groups"]]
    assert spec["spec"]["groups"] == plain


def test_promtool_unit_tests_pass():
    promtool = require_binary("promtool")
    tests = sorted(TESTS_DIR.glob("*.yml"))
    assert tests
    proc = subprocess.run([promtool, "test", "rules", *(t.name for t in tests)],
                          capture_output=True, text=True, cwd=TESTS_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(tests), proc.stdout


def test_promtool_unit_tests_can_fail(tmp_path):
    """A wrong expectation must fail: the suite above is not vacuous."""
    promtool = require_binary("promtool")
    text = (TESTS_DIR / "gpu_memory.yml").read_text().replace(
        "it keeps grows 64MiB/s", "it keeps grows 1MiB/s")
    text = text.replace("../gpuwatch.", str(ALERTS_DIR) + "/gpuwatch.")
    bad = tmp_path / "bad.yml"
    bad.write_text(text)
    proc = subprocess.run([promtool, "test", "rules", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "FAILED" in proc.stdout + proc.stderr


def _unit_tests() -> list[dict]:
    return [test for f in sorted(TESTS_DIR.glob("*.yml"))
            for test in yaml.safe_load(f.read_text())["tests"]]


def test_every_alert_is_tested_firing_and_not_firing():
    fired: set[tuple[str, str]] = set()
    quiet: set[str] = set()
    for test in _unit_tests():
        for case in test.get("alert_rule_test", []):
            if case.get("exp_alerts"):
                fired |= {(case["alertname"], a["exp_labels"]["severity"])
                          for a in case["exp_alerts"]}
            else:
                quiet.add(case["alertname"])
    generated = {(a.alert, a.severity) for group in rules.alert_groups(rules.RuleParams()).values()
                 for a in group}
    assert generated - fired == set(), "alerts never tested firing"
    assert set(rules.alert_names()) - quiet == set(), "alerts never tested not firing"


def test_every_recording_rule_is_tested():
    exprs = " ".join(case["expr"] for test in _unit_tests()
                     for case in test.get("promql_expr_test", []))
    records = [r.record for r in rules.recording_rules(rules.RuleParams())]
    untested = [name for name in records if name not in exprs]
    assert untested == []


def test_alerts_follow_the_mixin_conventions():
    p = rules.RuleParams()
    doc = rules.alerts_document(p)
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule["alert"]
            assert re.fullmatch(r"Gpuwatch(?:[A-Z][a-z0-9]*)+", name), name
            assert rule["labels"]["severity"] in ("warning", "critical"), name
            ann = rule["annotations"]
            assert set(ann) == {"summary", "description", "runbook_url"}, name
            assert ann["runbook_url"] == f"{p.runbook_url}#{name.lower()}"
            assert ann["summary"].endswith(".") and ann["description"].endswith("."), name
            assert re.fullmatch(r"\d+[smh]", rule["for"]), name


def test_recording_rules_are_named_level_metric_operations():
    for r in rules.recording_rules(rules.RuleParams()):
        assert re.fullmatch(r"[a-z_]+:gpuwatch_[a-z0-9_]+:[a-z0-9_]+", r.record), r.record


def _all_exprs(p: rules.RuleParams) -> list[str]:
    return ([r.expr for r in rules.recording_rules(p)]
            + [a.expr for g in rules.alert_groups(p).values() for a in g])


def test_no_rate_on_a_gauge_and_no_deriv_on_a_counter():
    for expr in _all_exprs(rules.RuleParams()):
        for fn, metric in re.findall(r"\b(rate|irate|increase|deriv)\((\w+)", expr):
            if fn == "deriv":
                assert not metric.endswith("_total"), expr
            else:  # a counter, or a histogram's (which are counters)
                assert metric.endswith(("_total", "_bucket", "_count", "_sum")), \
                    f"{fn}() over the gauge {metric}: {expr}"


def test_ratios_are_ratios_of_sums():
    """No avg() anywhere: an average of per-engine ratios weighs an idle engine like a busy one."""
    for expr in _all_exprs(rules.RuleParams()):
        assert "avg" not in expr, expr


def test_every_selector_is_scoped_to_the_job():
    p = rules.RuleParams(job="gpu-fleet")
    for expr in _all_exprs(p):
        for metric, matchers in re.findall(r"\b([a-z_:]+)\{([^}]*)\}", expr):
            assert 'job="gpu-fleet"' in matchers, f"{metric} in {expr}"
        assert 'job="gpuwatch"' not in expr
    absent = [a.expr for a in rules.alert_groups(p)["gpuwatch-exporter"]
              if a.alert == "GpuwatchExporterAbsent"]
    # absent(up{job="x"} == 1) would lose the job label
    assert absent == ['absent(up{job="gpu-fleet"})']


def test_thresholds_come_from_the_parameters():
    p = rules.RuleParams(leak_warning_bytes_per_second=52428.8, queue_latency_slo_seconds=0.5,
                         queue_latency_quantile="0.99", leak_keep_firing_for="7m")
    text = rules.render(p)[rules.ALERTS_FILE]
    assert "(warning slope 3 MiB/min" in text and "keep_firing_for: 7m" in text
    assert 'quantile="0.99"} > 0.5' in text
    default = rules.render(rules.RuleParams())[rules.ALERTS_FILE]
    # 12 MiB/min and 50 MiB/s, the threshold table's slopes, quoted in MiB
    assert "(warning slope 12 MiB/min" in default and "(critical slope 50 MiB/s" in default


def test_leak_alerts_fire_on_the_daemons_verdict():
    """Never on a re-thresholded estimate: the verdict carries the daemon's hysteresis."""
    by_name: dict[str, list] = {}
    for group in rules.alert_groups(rules.RuleParams()).values():
        for a in group:
            by_name.setdefault(a.alert, []).append(a)
    for name, metric in (("GpuwatchProcessMemoryLeak", "gpuwatch_process_memory_leak_severity"),
                         ("GpuwatchGpuMemoryLeak", "gpuwatch_gpu_memory_leak_severity"),
                         ("GpuwatchGpuTimeToOom", "gpuwatch_gpu_time_to_oom_severity")):
        exprs = {a.severity: a.expr for a in by_name[name]}
        assert exprs == {"warning": f'{metric}{{job="gpuwatch"}} >= 1',
                         "critical": f'{metric}{{job="gpuwatch"}} == 2'}, name
        assert all(a.keep_firing_for for a in by_name[name]), name


def test_runbook_url_option(tmp_path):
    out = _generate(tmp_path, "--runbook-url", "https://wiki.example.com/gpu/runbook")
    text = (out / rules.ALERTS_FILE).read_text()
    assert "runbook_url: https://wiki.example.com/gpu/runbook#gpuwatchgpulost\n" in text
    assert rules.RUNBOOK_URL not in text


def test_bad_job_names_are_refused():
    result = CliRunner().invoke(alerts_command, ["--job", 'a"b', "-o", "unused"])
    assert result.exit_code == 2
    assert "--job" in result.output and "not a plain Prometheus job name" in result.output
    with pytest.raises(ValueError, match="format"):
        rules.render(rules.RuleParams(), "jsonnet")


def test_runbook_has_one_section_per_alert():
    headings = re.findall(r"^## (\S+)\s*$", RUNBOOK.read_text(), flags=re.M)
    assert sorted(headings) == sorted(set(headings)), "duplicate runbook sections"
    assert sorted(headings) == sorted(rules.alert_names())
    # runbook_url anchors are GitHub's: the heading, lower-cased
    p = rules.RuleParams()
    assert p.runbook_url.endswith("docs/runbook.md")
