"""Memory zone: hysteresis, and planned pools (a healthy vLLM is never paged on)."""

from __future__ import annotations

import pytest

from gpuwatch.config import load
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived, EngineState
from gpuwatch.signals.memory import MemoryAnalyzer
from gpuwatch.signals.zone import ZoneState, planned_bytes, pool_fraction
from gpuwatch.thresholds import load_table

MIB = 1 << 20
GIB = 1 << 30
TOTAL = 80 * GIB  # A100-SXM4-80GB
WARN, CRIT = 62000 * MIB, 73500 * MIB


def vllm(pids, **cache) -> EngineState:
    cc = {k: str(v) for k, v in cache.items()}
    return EngineState(name="vllm-0", kind="vllm", up=True, pids=list(pids), cache_config=cc)


def gpu(t_used: float, procs=()) -> GpuSample:
    return GpuSample(index=0, uuid="GPU-0", name="NVIDIA A100-SXM4-80GB",
                     memory_total_bytes=TOTAL, memory_used_bytes=int(t_used),
                     processes=[ProcessSample(pid=p, used_memory_bytes=None if u is None
                                              else int(u), create_time=1.0) for p, u in procs])


def zone_run(samples, engines=None, **zone):
    """Feed GpuSamples one per 2 s; return (events, derived)."""
    cfg = load(None, environ={}, overrides={"signals": {"zone": zone}} if zone else None)
    analyzer, derived, cond = MemoryAnalyzer(cfg, load_table()), Derived(), Conditions()
    derived.engines = engines or {}
    events = []
    for i, g in enumerate(samples):
        events += [e for e in analyzer.update(Tick(t=1000.0 + 2 * i, gpus=[g]), derived, cond)
                   if e.signal == "memory_zone"]
    return events, derived


def test_zone_state_debounce_and_hysteresis():
    z = ZoneState()
    band = 0.02 * TOTAL
    seq = [60, 63, 63, 75, 75, 73, 72, 70, 60.5, 59]
    levels = [z.update(v * 1000 * MIB, WARN, CRIT, band, 2) for v in seq]
    # 63 GB twice -> warning; 75 twice -> critical; back below 73.5 - 1.6 GB -> warning;
    # below 62 - 1.6 GB -> safe
    assert levels == [0, 0, 1, 1, 2, 2, 2, 1, 1, 0]


def test_a_brief_spike_does_not_enter_a_zone():
    z = ZoneState()
    assert [z.update(v, WARN, CRIT, 0, 2) for v in (CRIT + 1, WARN - 1, CRIT + 1)] == [0, 0, 0]


def test_pool_fraction():
    assert pool_fraction(vllm([1], gpu_memory_utilization=0.85), 0.9) == (
        0.85, "gpu_memory_utilization")
    assert pool_fraction(vllm([1]), 0.9)[0] == 0.9  # vLLM's default when unpublished
    sg = EngineState(name="s", kind="sglang", cache_config={"mem_fraction_static": "0.8"})
    assert pool_fraction(sg, 0.9) == (0.8, "mem_fraction_static")
    assert pool_fraction(EngineState(name="t", kind="tgi"), 0.9) is None
    assert pool_fraction(vllm([1], gpu_memory_utilization="None"), 0.9)[0] == 0.9


def test_planned_bytes_counts_what_the_engine_holds_up_to_its_pool():
    g = gpu(78 * GIB, [(100, 72 * GIB), (200, 5 * GIB)])
    planned, notes = planned_bytes(g, {"vllm-0": vllm([100], gpu_memory_utilization=0.9)}, 0.9)
    assert planned == 72 * GIB and "vllm-0" in notes[0]
    # an engine over its pool: the excess is not planned
    g = gpu(78 * GIB, [(100, 76 * GIB)])
    planned, _ = planned_bytes(g, {"vllm-0": vllm([100], gpu_memory_utilization=0.9)}, 0.9)
    assert planned == 0.9 * TOTAL
    # no per-process figures: the whole pool is planned
    g = gpu(74 * GIB, [(100, None)])
    planned, _ = planned_bytes(g, {"vllm-0": vllm([100], gpu_memory_utilization=0.9)}, 0.9)
    assert planned == 0.9 * TOTAL
    # an engine whose pids are not on this GPU plans nothing here
    assert planned_bytes(g, {"vllm-0": vllm([999])}, 0.9) == (0.0, [])


def test_healthy_vllm_above_the_red_line_is_never_paged():
    used = 0.9 * TOTAL + 600 * MIB  # 74.3 GB: above the A100's 73.5 GB red line
    samples = [gpu(used, [(100, 0.9 * TOTAL)])] * 50
    events, derived = zone_run(samples, {"vllm-0": vllm([100], gpu_memory_utilization=0.9)})
    assert events == []
    sig = derived.gpus["GPU-0"]
    assert sig.zone == 0 and sig.unplanned_memory_bytes == 600 * MIB
    assert any("pre-allocates 0.9" in n for n in sig.notes)


def test_same_memory_without_an_engine_is_critical():
    used = 0.9 * TOTAL + 600 * MIB
    events, derived = zone_run([gpu(used, [(100, 0.9 * TOTAL)])] * 5)
    assert [(e.state, e.severity) for e in events] == [("firing", "critical")]
    assert events[0].threshold == CRIT and events[0].value == used
    assert "calibrated row a100-80gb" in events[0].message
    assert derived.gpus["GPU-0"].zone == 2


def test_unplanned_memory_next_to_vllm_is_judged():
    # vLLM at 0.6 holds its pool; a second process grows next to it
    engines = {"vllm-0": vllm([100], gpu_memory_utilization=0.6)}
    pool = 0.6 * TOTAL
    samples = [gpu(pool + (8 + i) * GIB, [(100, pool), (200, (8 + i) * GIB)])
               for i in range(60)]
    events, derived = zone_run(samples, engines)
    # unplanned = 8 .. 67 GiB: warning past 62000 MiB, critical past 73500 MiB never
    assert [(e.state, e.severity) for e in events] == [("firing", "warning")]
    assert derived.gpus["GPU-0"].unplanned_memory_bytes == 67 * GIB


def test_zone_resolves_with_hysteresis():
    up = [gpu(70 * GIB)] * 3
    down = [gpu(60.2 * GIB)] * 3 + [gpu(58 * GIB)] * 3
    events, _ = zone_run(up + down, hold_seconds=0)
    assert [(e.state, e.severity) for e in events] == [
        ("firing", "warning"), ("resolved", "warning")]
    # resolved only once below 62000 MiB - 2 % of 80 GiB
    assert events[1].t == 1000.0 + 2 * 6  # the first 58 GiB sample
    assert events[1].ref == events[0].id and events[0].id


def test_zone_holds_for_its_minimum_hold():
    # below the exit level for 58 s, back up, then below for 60 s: one episode
    up = [gpu(70 * GIB)] * 3
    events, _ = zone_run(up + [gpu(58 * GIB)] * 30 + up + [gpu(58 * GIB)] * 31, hold_seconds=60)
    assert [(e.state, e.severity) for e in events] == [
        ("firing", "warning"), ("resolved", "warning")]
    assert events[1].t == 1000.0 + 2 * (3 + 30 + 3 + 30)


def test_planned_pools_can_be_turned_off():
    used = 0.9 * TOTAL + 600 * MIB
    events, _ = zone_run([gpu(used, [(100, 0.9 * TOTAL)])] * 5,
                         {"vllm-0": vllm([100], gpu_memory_utilization=0.9)},
                         planned_pools=False)
    assert [e.severity for e in events] == ["critical"]


def test_derived_row_is_named_in_the_event():
    g = GpuSample(index=1, uuid="GPU-h", name="NVIDIA H200", memory_total_bytes=143771 * MIB,
                  memory_used_bytes=135 * GIB)
    events, derived = zone_run([g] * 3)
    assert events[0].severity == "critical" and "derived row derived" in events[0].message
    assert derived.gpus["GPU-h"].threshold_calibrated is False


@pytest.mark.parametrize("enter", [1, 2, 3])
def test_a_fresh_zone_enters_after_exactly_its_entry_samples(enter):
    """The debounce counts from the first sample above the zone: `enter` samples above the
    critical line enter it from a fresh state, one fewer does not."""
    z = ZoneState()
    levels = [z.update(100.0, warning=50.0, critical=80.0, band=5.0, enter_samples=enter)
              for _ in range(enter)]
    assert levels[:-1] == [0] * (enter - 1) and levels[-1] == 2
