"""The simulated backend: deterministic, and each scenario shows what it promises."""

from __future__ import annotations

import pytest

from gpuwatch.sources.simulate import SimulatedBackend

MIB = 1 << 20


def run(scenario: str, seconds: float, seed: int = 0, step: float = 2.0):
    b = SimulatedBackend(scenario, seed=seed)
    t = 0.0
    out = []
    while t <= seconds:
        out.append((t, b.sample(1e9 + t)))
        t += step
    return out


def test_deterministic_for_a_seed():
    assert run("mixed", 120, seed=3) == run("mixed", 120, seed=3)
    assert run("mixed", 120, seed=3) != run("mixed", 120, seed=4)


def test_leak_scenario_leaks_64_mib_per_second_after_20_s():
    samples = run("leak", 200)
    by_t = {t: {p.name: p.used_memory_bytes for p in gpus[0].processes} for t, gpus in samples}
    leaky_60, leaky_160 = by_t[60.0]["leaky-worker"], by_t[160.0]["leaky-worker"]
    # clearly above the critical slope (50 MiB/s): the demo's verdict never hangs on tolerance
    assert (leaky_160 - leaky_60) / 100 == pytest.approx(64 * MIB, rel=0.05)
    steady_60, steady_160 = by_t[60.0]["python3"], by_t[160.0]["python3"]
    assert abs(steady_160 - steady_60) < 300 * MIB  # the other process does not grow
    # steady from the end of warm-up (16 s) until the leak starts at 20 s
    assert abs(by_t[20.0]["leaky-worker"] - by_t[16.0]["leaky-worker"]) < 300 * MIB


def test_leaking_process_restarts_with_new_pid_before_exceeding_the_gpu():
    samples = run("leak", 2400, step=10)
    pids = set()
    for _, gpus in samples:
        g = gpus[0]
        assert g.memory_used_bytes <= g.memory_total_bytes
        pids |= {p.pid for p in g.processes if p.name == "leaky-worker"}
    assert len(pids) >= 2


def test_leak_fixed_stops_after_three_minutes_and_leak_early_starts_late():
    fixed = {t: {p.name: p.used_memory_bytes for p in gpus[0].processes}
             for t, gpus in run("leak-fixed", 600, step=10)}
    grown = fixed[200.0]["leaky-worker"] - fixed[20.0]["leaky-worker"]
    assert grown == pytest.approx(180 * 64 * MIB, rel=0.05)
    assert abs(fixed[600.0]["leaky-worker"] - fixed[210.0]["leaky-worker"]) < 300 * MIB
    early = {t: {p.name: p.used_memory_bytes for p in gpus[0].processes}
             for t, gpus in run("leak-early", 400, step=2)}
    assert "early-leaker" not in early[28.0] and "early-leaker" in early[32.0]
    # loading in bursts (stair steps), then flat until the leak at age 150 s (t = 180 s)
    loading = [early[t]["early-leaker"] for t in range(32, 54, 2)]
    assert len(set(loading)) <= 7
    assert abs(early[170.0]["early-leaker"] - early[110.0]["early-leaker"]) < 300 * MIB
    assert (early[380.0]["early-leaker"] - early[280.0]["early-leaker"]) / 100 == \
        pytest.approx(64 * MIB, rel=0.05)


def test_mixed_has_four_models_and_several_processes():
    (_, gpus), = run("mixed", 0)
    assert len({g.name for g in gpus}) == 4
    assert all(len(g.processes) >= 1 for g in gpus)
    assert sum(len(g.processes) for g in gpus) >= 8
    b = SimulatedBackend("mixed")
    b.sample(0.0)
    engines = b.engines(60.0)
    assert engines and engines[0].kind == "vllm" and "vllm:num_requests_running" in (
        engines[0].exposition)
    assert engines[0].pids[0] in {p.pid for p in b.sample(60.0)[1].processes}


def test_fragmentation_scenario_publishes_fragmenting_probe():
    b = SimulatedBackend("fragmentation")
    b.sample(0.0)
    early = {p.pid: p for p in b.probes(25.0)}
    late = {p.pid: p for p in b.probes(200.0)}
    frag = [pid for pid, p in late.items()
            if p.largest_free_block_bytes / p.total_free_bytes < 0.6]
    assert len(frag) == 1
    assert early[frag[0]].free_blocks < late[frag[0]].free_blocks


def test_unknown_scenario():
    with pytest.raises(ValueError, match="unknown scenario"):
        SimulatedBackend("nope")


def test_the_cli_offers_every_scenario():
    from gpuwatch.cli import SCENARIO_NAMES
    from gpuwatch.sources.simulate.scenarios import SCENARIOS

    assert set(SCENARIO_NAMES) == set(SCENARIOS)
