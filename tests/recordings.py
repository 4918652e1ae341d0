"""Recordings of simulated hosts, written without waiting for real time to pass."""

from __future__ import annotations

from pathlib import Path

from gpuwatch.model import Tick
from gpuwatch.recording import Recorder
from gpuwatch.sources.simulate import SimulatedBackend

T0 = 1.8e9


def simulated_recording(path: Path, scenario: str, seconds: float, interval: float = 2.0,
                        seed: int = 0) -> Path:
    """What `gpuwatch run --simulate SCENARIO --record PATH` would write over `seconds`."""
    backend = SimulatedBackend(scenario, seed=seed, interval=interval)
    rec = Recorder(str(path), host=f"sim-{scenario}", interval_s=interval)
    for k in range(int(seconds / interval)):
        t = T0 + k * interval
        rec.write(Tick(t=t, gpus=backend.sample(t), engines=backend.engines(t),
                       probes=backend.probes(t)))
    rec.close()
    return path
