"""The example Alertmanager and Prometheus configurations under exporters/."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import urllib.request

import pytest

from tests.helpers import REPO, require_binary, wait_until

AM_CONFIG = REPO / "exporters" / "alertmanager.yml"


def test_amtool_accepts_the_alertmanager_example():
    amtool = require_binary("amtool")
    proc = subprocess.run([amtool, "check-config", str(AM_CONFIG)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@pytest.mark.parametrize(("labels", "receiver"), [
    (["severity=critical", "alertname=GpuwatchGpuLost"], "gpu-pager"),
    (["severity=warning", "alertname=GpuwatchProcessMemoryLeak"], "gpu-tickets"),
    (["alertname=SomethingElse"], "gpu-tickets"),
])
def test_routes_by_severity(labels, receiver):
    amtool = require_binary("amtool")
    proc = subprocess.run([amtool, "config", "routes", "test", f"--config.file={AM_CONFIG}",
                           *labels], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == [receiver]


def _post_alerts(url: str, alerts: list[dict]) -> None:
    now = dt.datetime.now(dt.UTC)
    body = [{"labels": labels, "annotations": {"summary": "test"},
             "startsAt": now.isoformat(),
             "endsAt": (now + dt.timedelta(hours=1)).isoformat()} for labels in alerts]
    req = urllib.request.Request(url + "/api/v2/alerts", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200


@pytest.mark.integration
def test_exporter_down_inhibits_everything_from_that_exporter(alertmanager):
    am = alertmanager(AM_CONFIG.read_text())
    base = {"job": "gpuwatch"}
    down = {**base, "alertname": "GpuwatchExporterDown", "instance": "gpu-a:19400",
            "severity": "critical"}
    leak_a = {**base, "alertname": "GpuwatchGpuMemoryLeak", "instance": "gpu-a:19400",
              "uuid": "GPU-a", "gpu": "0", "severity": "warning"}
    engine_a = {**base, "alertname": "GpuwatchEngineDown", "instance": "gpu-a:19400",
                "engine": "vllm-0", "severity": "critical"}
    leak_b = {**base, "alertname": "GpuwatchGpuMemoryLeak", "instance": "gpu-b:19400",
              "uuid": "GPU-b", "gpu": "0", "severity": "warning"}
    tto_b_warn = {**base, "alertname": "GpuwatchGpuTimeToOom", "instance": "gpu-b:19400",
                  "uuid": "GPU-b", "gpu": "0", "severity": "warning"}
    tto_b_crit = {**tto_b_warn, "severity": "critical"}
    _post_alerts(am.url, [down, leak_a, engine_a, leak_b, tto_b_warn, tto_b_crit])

    def states():
        got = {}
        for a in am.alerts():
            lab = a["labels"]
            got[(lab["alertname"], lab["instance"], lab["severity"])] = a["status"]["state"]
        return got if len(got) == 6 else None

    got = wait_until(states, 15, what="alertmanager to hold the six alerts")
    assert got == {
        ("GpuwatchExporterDown", "gpu-a:19400", "critical"): "active",
        # the exporter on gpu-a is down: whatever else it said is stale
        ("GpuwatchGpuMemoryLeak", "gpu-a:19400", "warning"): "suppressed",
        ("GpuwatchEngineDown", "gpu-a:19400", "critical"): "suppressed",
        # another host is not affected
        ("GpuwatchGpuMemoryLeak", "gpu-b:19400", "warning"): "active",
        # a critical alert hides the warning of the same alert on the same GPU
        ("GpuwatchGpuTimeToOom", "gpu-b:19400", "critical"): "active",
        ("GpuwatchGpuTimeToOom", "gpu-b:19400", "warning"): "suppressed",
    }
