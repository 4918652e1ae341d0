"""gpuwatch_remediation_actions_total and the shipped Alertmanager example."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.exporter.families import MODULES
from gpuwatch.exporter.families import remediation as family
from gpuwatch.exporter.snapshot import Snapshot
from tests.helpers import REPO

EXAMPLE = REPO / "exporters" / "alertmanager-webhook.yml"


class _Collector:
    def __init__(self, snap):
        self.snap = snap

    def collect(self):
        yield from family.collect(self.snap)


def exposition(snap) -> str:
    reg = CollectorRegistry()
    reg.register(_Collector(snap))
    return generate_latest(reg).decode()


def samples(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "gpuwatch_remediation_actions_total":
                out[(s.labels["action"], s.labels["result"])] = s.value
    return out


def test_every_combination_is_there_from_the_start():
    got = samples(exposition(Snapshot()))
    assert len(got) == 4 * 6 and set(got.values()) == {0.0}
    assert {a for a, _ in got} == {"flush", "snapshot", "signal", "exec"}
    assert {r for _, r in got} == {"ok", "failed", "dry_run", "skipped_cooldown",
                                   "skipped_rate_limit", "refused"}


def test_counts_come_from_the_remediators_counters():
    snap = Snapshot(extras={"remediation": {("snapshot", "ok"): 3, ("signal", "refused"): 2,
                                            "junk": 9}})
    text = exposition(snap)
    got = samples(text)
    assert got[("snapshot", "ok")] == 3 and got[("signal", "refused")] == 2
    assert got[("flush", "ok")] == 0
    assert "# TYPE gpuwatch_remediation_actions_total counter" in text


def test_registered_with_the_exporter():
    assert "gpuwatch.exporter.families.remediation" in MODULES


def test_promtool_finds_nothing_to_complain_about():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is installed by the README's test command")
    body = exposition(Snapshot(extras={"remediation": {("exec", "failed"): 1}}))
    res = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                         capture_output=True, timeout=30)
    assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def _amtool() -> str:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool is installed by the README's test command")
    return amtool


def test_alertmanager_example_is_valid():
    res = subprocess.run([_amtool(), "check-config", str(EXAMPLE)], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@pytest.mark.parametrize("labels,receivers", [
    (["alertname=GpuwatchProcessMemoryLeak", "severity=critical"], "gpuwatch-remediation,ops"),
    (["alertname=GpuwatchGpuMemoryZone", "severity=critical"], "gpuwatch-remediation,ops"),
    (["alertname=GpuwatchProcessMemoryLeak", "severity=warning"], "ops"),
    (["alertname=GpuwatchKvCacheHitRatioLow", "severity=critical"], "ops"),
])
def test_alertmanager_example_routes_only_critical_memory_alerts_to_gpuwatch(labels, receivers):
    res = subprocess.run([_amtool(), "config", "routes", "test", f"--config.file={EXAMPLE}",
                          *labels], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == receivers
