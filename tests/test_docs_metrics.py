"""Every metric family the daemon exports is documented in docs/metrics.md."""

from __future__ import annotations

import re
from pathlib import Path

from gpuwatch.config import load
from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import Tick
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.sources.simulate import SimulatedBackend
from gpuwatch.thresholds import load_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def exported_families(scenario: str, seconds: float) -> set[str]:
    cfg = load(None, environ={})
    backend = SimulatedBackend(scenario)
    pipeline = Pipeline(cfg, load_table(None))
    t0 = 1.8e9
    tick = None
    for k in range(int(seconds / 2)):
        t = t0 + 2 * k
        tick = Tick(t=t, gpus=backend.sample(t), engines=backend.engines(t),
                    probes=backend.probes(t))
        for g in tick.gpus:  # slow tier too
            for key, v in backend.sample_slow(t)[g.uuid].items():
                setattr(g, key, v)
        pipeline.update(tick)
    snap = Snapshot(version=1, tick=tick, derived=pipeline.derived, ready=True, started=t0,
                    extras={"remediation": {("snapshot", "ok"): 1},
                            "ticks": {"failures_total": 0}})
    body = Renderer().render(snap).decode()
    return set(re.findall(r"^# TYPE (\S+) ", body, re.M))


def test_every_exported_family_is_documented():
    documented = set(re.findall(r"`(gpuwatch_[a-z0-9_]+)", DOC.read_text()))  # e2e
    exported = exported_families("mixed", 120) | exported_families("leak", 120)
    assert len(exported) > 50
    assert {"gpuwatch_process_memory_leak_rate_bytes_per_second",
            "gpuwatch_gpu_time_to_oom_seconds", "gpuwatch_engine_kv_cache_hit_ratio",
            "gpuwatch_process_allocator_fragmentation_ratio"} <= exported
    missing = sorted(exported - documented)
    assert not missing, f"not in docs/metrics.md: {missing}"
