"""Our exposition writer against prometheus_client's, byte for byte, and against promtool."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.exporter.text import exposition
from gpuwatch.model import Tick
from gpuwatch.sources.simulate import SimulatedBackend


class _Fixed:
    def __init__(self, metrics):
        self.metrics = metrics

    def collect(self):
        return iter(self.metrics)


def _reference(metrics) -> bytes:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Fixed(metrics))
    return generate_latest(reg)


def _snapshot(scenario: str, t: float) -> Snapshot:
    backend = SimulatedBackend(scenario)
    backend.sample(0.0)
    tick = Tick(t=t, gpus=backend.sample(t), probes=backend.probes(t))
    return Snapshot(version=1, tick=tick, ready=True, started=1.0)


@pytest.mark.parametrize("scenario", ["mixed", "large"])
def test_same_bytes_as_prometheus_client(scenario):
    renderer = Renderer()
    renderer.collector.snapshot = _snapshot(scenario, 300.0)
    metrics = list(renderer.collector.collect())
    assert len(metrics) > 10
    assert exposition(metrics) == _reference(metrics)


def test_escaping_matches_reference():
    g = GaugeMetricFamily("x_bytes", 'help with \\ and\nnewline', labels=["a", "b"])
    g.add_metric(['quote " here', "back\\slash\nnl"], 1.5)
    g.add_metric(["ünïcode", ""], float("nan"))
    c = CounterMetricFamily("y", "c", labels=["z"])
    c.add_metric(["1"], 3)
    assert exposition([g, c]) == _reference([g, c])


def test_promtool_accepts_a_large_host():
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by the README's test command"
    body = Renderer().render(_snapshot("large", 300.0))
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                       timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
