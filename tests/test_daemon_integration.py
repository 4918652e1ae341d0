"""The real daemon, scraped by a real Prometheus."""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.integration


def test_simulated_mixed_series_reach_prometheus(daemon, prometheus):
    d = daemon("--simulate", "mixed")
    prom = prometheus([d.address])
    prom.wait_for('up{job="gpuwatch"} == 1')
    gpus = prom.wait_for("gpuwatch_gpu_memory_used_bytes")
    assert len(gpus) == 4
    names = {r["metric"]["name"] for r in prom.query("gpuwatch_gpu_info")}
    assert "NVIDIA L40S" in names and "NVIDIA GeForce RTX 4090" in names
    procs = prom.wait_for("gpuwatch_process_gpu_memory_used_bytes > 0")
    assert len(procs) >= 8
    assert {"gpu", "uuid", "pid", "process"} <= set(procs[0]["metric"])
    assert prom.query("gpuwatch_nvml_up == 1")
    assert prom.query('gpuwatch_collect_duration_seconds{source="nvml"}')


def test_promtool_check_metrics_is_clean(daemon):
    d = daemon("--simulate", "mixed")
    body = d.metrics()
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by the README's test command"
    result = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                            capture_output=True, timeout=30)
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr
    )


def test_without_gpu_keeps_serving_with_nvml_down(daemon):
    d = daemon()
    body = d.metrics()
    state = d.state()
    if state["sources"]["nvml"]["up"]:
        pytest.skip("a real GPU is present: the no-GPU path cannot be shown here")
    assert "gpuwatch_nvml_up 0.0" in body
    assert "gpuwatch_up 1.0" in body
    assert state["sources"]["nvml"]["reason"]
