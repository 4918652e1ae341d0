"""Simulated engines are well formed: counters and buckets only grow, restarts happen only
where the scenario says, and what the daemon derives agrees with the simulator's formulas."""

from __future__ import annotations

import pytest

from gpuwatch.exposition import read
from gpuwatch.model import Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.engine import EngineAnalyzer
from gpuwatch.sources.simulate import SimulatedBackend
from gpuwatch.sources.simulate import engine_text as sim

T0 = 1.7e9


def _engine_age(backend: SimulatedBackend, now: float, name: str) -> float:
    elapsed = now - backend.start
    return next(age for _, spec, _, age, _, _ in backend._alive(elapsed) if spec.engine == name)


def test_mixed_engine_over_three_simulated_hours():
    backend = SimulatedBackend("mixed")
    analyzer, derived, conditions = EngineAnalyzer(), Derived(), Conditions()
    events = []
    last: dict[str, dict[str, float]] = {}
    scrapes = 0
    every = backend.scenario.engines_every_seconds
    for k in range(int(3 * 3600 / every)):
        now = T0 + k * every
        samples = backend.engines(now)
        for s in samples:
            if s.exposition is None:
                continue
            reading, why = read(s.exposition)
            assert reading is not None, why
            scrapes += 1
            for group, values in reading.counters.items():
                prev = last.setdefault(group, {})
                for name, v in values.items():
                    assert v >= prev.get(name, 0.0), f"{name} went down at +{k * every}s"
                    prev[name] = v
            buckets = [reading.counters["engine=0"][f"queue_le:{b!r}"]
                       for b in reading.queue_bounds]
            assert buckets == sorted(buckets), "buckets are not cumulative"
        events += analyzer.update(Tick(t=now, engines=samples), derived, conditions)
    assert scrapes > 2000
    st = derived.engines["vllm-sim-0"]
    assert st.up and st.restarts_detected == 0 and st.replicas == 1
    age = _engine_age(backend, now, "vllm-sim-0")
    assert st.preemptions_total == sim.preemptions_total(age) == pytest.approx(age / 90, abs=1)
    assert st.queue_requests_total == sim.finished_total(age) == pytest.approx(4 * age, abs=1)
    assert st.prefix_cache_queries_total == sim.queries_total(age)
    assert st.prefix_cache_hits_total == sim.hits_total(age)
    assert st.queue_seconds_total == sim.queue_seconds_total(age)
    # windowed values agree with the rates the formulas give
    assert st.preemption_rate_per_second == pytest.approx(1 / 90, rel=0.25)
    assert st.queue_requests_in_window == pytest.approx(4 * 300, rel=0.02)
    assert 0.45 < st.kv_cache_hit_ratio < 0.8
    assert 0.1 < st.queue_latency_seconds["0.5"] < 0.5
    assert not [e for e in events if e.engine == "vllm-sim-0"]


def test_simulated_counters_are_monotonic_at_every_instant():
    prev = None
    for tenth in range(0, 2 * 3600 * 10, 7):
        e = tenth / 10
        now = (sim.queries_total(e), sim.hits_total(e), sim.finished_total(e),
               sim.preemptions_total(e), sim.queue_seconds_total(e), *sim.queue_buckets(e))
        if prev is not None:
            assert all(a <= b for a, b in zip(prev, now, strict=True)), f"at {e}s"
        buckets = sim.queue_buckets(e)
        assert buckets == sorted(buckets) and buckets[-1] <= sim.finished_total(e)
        assert sim.hits_total(e) <= sim.queries_total(e)
        prev = now
