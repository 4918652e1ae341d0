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
from gpuwatch.sources.simulate.workload import CYCLING

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


def _ttft_p99(exposition: str) -> float:
    """The engine's first TTFT bound with 99 % of the requests under it."""
    from prometheus_client.parser import text_string_to_metric_families
    rows = [(float(s.labels["le"]), s.value)
            for fam in text_string_to_metric_families(exposition)
            if fam.name == "vllm:time_to_first_token_seconds"
            for s in fam.samples if s.name.endswith("_bucket")]
    total = rows[-1][1]
    return next(le for le, c in rows if c >= 0.99 * total)


def test_the_seed_picks_a_hosts_model_and_steady_load():
    # seed 0 is the default host; other seeds serve one of two models at their own load
    assert SimulatedBackend("mixed").model == "meta-llama/Llama-3.1-8B-Instruct"
    assert SimulatedBackend("mixed").traffic == CYCLING
    profiles = {s: (b.model, b.traffic) for s in range(1, 11)
                if (b := SimulatedBackend("mixed", seed=s))}
    assert len({m for m, _ in profiles.values()}) == 2
    assert len({t.load for _, t in profiles.values()}) == 5
    # a heavier load is a slower TTFT, and a steady one is the same in every window
    fast, slow = SimulatedBackend("mixed", seed=1), SimulatedBackend("mixed", seed=4)
    assert fast.traffic.load < 1 < slow.traffic.load
    p99 = {name: _ttft_p99(sim.vllm_exposition(3600.0, "m", traffic=b.traffic))
           for name, b in (("fast", fast), ("slow", slow))}
    assert p99["fast"] < p99["slow"], p99

    def spread(traffic) -> float:
        """How much the share of requests queued under 0.3 s moves from minute to minute."""
        shares = []
        for start in (3600.0, 3660.0, 3720.0):
            counts = [sim.queue_buckets(start + d, traffic)[0] for d in (0.0, 60.0)]
            shares.append((counts[1] - counts[0]) / (4 * 60))
        return max(shares) - min(shares)
    assert spread(fast.traffic) < 0.02 and spread(slow.traffic) < 0.02
    assert spread(CYCLING) > 0.1  # the default host's load cycles
