"""Headroom and time to OOM (spec §6), and the time_to_oom event."""

from __future__ import annotations

import pytest

from gpuwatch.config import load
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.config import TimeToOomConfig
from gpuwatch.signals.oom import HorizonState, headroom_bytes, time_to_oom
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.thresholds import load_table

MIB = 1 << 20
GIB = 1 << 30
T0 = 1_767_225_600.0
TOTAL = 80 * GIB
BUDGET = int(0.95 * (TOTAL - int(2.1 * GIB) - 512 * MIB))  # A100 row


def test_time_to_oom_is_headroom_over_rate():
    assert headroom_bytes(BUDGET, 70 * GIB) == BUDGET - 70 * GIB
    assert time_to_oom(1000.0, 10.0) == 100.0
    assert time_to_oom(-5.0, 10.0) == 0.0  # already past the budget and growing
    assert time_to_oom(1000.0, 0.0) is None
    assert time_to_oom(1000.0, -3.0) is None
    assert time_to_oom(1000.0, None) is None


def test_horizon_state():
    h = HorizonState()
    cfg = TimeToOomConfig(hold_seconds=0.0)
    assert h.update(0, 9000, True, cfg) == 0
    assert h.update(1, 7000, True, cfg) == 1
    assert h.update(2, 1700, True, cfg) == 2
    assert h.update(3, 2000, True, cfg) == 2  # within the resolve margin
    assert h.update(4, 2200, True, cfg) == 1
    assert h.update(5, 8000, True, cfg) == 1
    assert h.update(6, 9000, True, cfg) == 0
    assert h.update(7, 100, False, cfg) == 0  # no leak detected: nothing to say


def test_horizon_state_holds_a_level_for_its_minimum_hold():
    h = HorizonState()
    cfg = TimeToOomConfig(hold_seconds=120.0)
    assert h.update(0, 1700, True, cfg) == 2
    assert h.update(60, 9000, True, cfg) == 2  # below its exit: held
    assert h.update(90, 1700, True, cfg) == 2  # back: the hold starts again
    assert h.update(100, 9000, True, cfg) == 2
    assert h.update(219, 9000, True, cfg) == 2
    assert h.update(220, 9000, True, cfg) == 0


def run_leak(rate: float, base: float, seconds: float, onset: float = 3600.0, cfg=None):
    pipeline = Pipeline(cfg or load(None, environ={}), load_table())
    events = []
    for i in range(int(seconds / 3)):
        el = i * 3.0
        v = base + rate * max(0.0, el - onset)
        tick = Tick(t=T0 + el, gpus=[GpuSample(
            index=0, uuid="GPU-0", name="NVIDIA A100-SXM4-80GB", memory_total_bytes=TOTAL,
            memory_used_bytes=int(v + 500 * MIB),
            processes=[ProcessSample(pid=7, name="train", used_memory_bytes=int(v),
                                     create_time=T0 - 7200)])])
        events += pipeline.update(tick)
    return events, pipeline.derived


def test_fast_leak_near_the_budget_raises_time_to_oom():
    rate = 60 * MIB
    events, derived = run_leak(rate, 40 * GIB, 3600 + 150)
    ttoom = [e for e in events if e.signal == "time_to_oom"]
    assert ttoom and ttoom[0].state == "firing" and ttoom[0].severity == "critical"
    assert ttoom[0].gpu_uuid == "GPU-0" and ttoom[0].threshold == 1800.0
    gpu = derived.gpus["GPU-0"]
    used = 40 * GIB + rate * 147 + 500 * MIB
    assert gpu.time_to_oom_seconds == pytest.approx((BUDGET - used) / rate, rel=0.2)
    proc = derived.processes[("GPU-0", 7)]
    assert proc.time_to_oom_seconds == pytest.approx(gpu.time_to_oom_seconds, rel=0.2)


def test_slow_leak_close_to_the_budget_is_critical_through_time_to_oom():
    # 30 MiB/min from 1.2 GiB under the budget: found as a warning, it becomes critical in
    # the same episode once its time to OOM falls under the 30 min horizon
    rate = 30 * MIB / 60
    base = BUDGET - 500 * MIB - 1200 * MIB
    events, _derived = run_leak(rate, base, 3600 + 45 * 60)
    leak = [e for e in events if e.signal == "memory_leak"]
    assert [(e.state, e.severity, e.pid) for e in leak] == [
        ("firing", "warning", 7), ("firing", "critical", 7)]
    assert "time to OOM" in leak[1].message and leak[1].ref == leak[0].id
    # when it became critical, the headroom left at that rate was under 30 min
    used = base + rate * (leak[1].t - T0 - 3600) + 500 * MIB
    assert (BUDGET - used) / rate < 1800 * 1.1
    # the entry level it crossed: the warning slope less its tolerance
    assert leak[0].threshold == pytest.approx(0.9 * 12 * MIB / 60)


def test_slow_leak_with_room_is_only_a_warning():
    rate = 30 * MIB / 60
    events, _ = run_leak(rate, 10 * GIB, 3600 + 45 * 60)
    assert [e.severity for e in events if e.signal == "memory_leak"] == ["warning"]
    assert [e for e in events if e.signal == "time_to_oom"] == []


def test_horizon_is_configurable():
    cfg = load(None, environ={}, overrides={"signals": {"time_to_oom": {
        "critical_seconds": 10 * 86400, "warning_seconds": 20 * 86400}}})
    events, _ = run_leak(30 * MIB / 60, 10 * GIB, 3600 + 45 * 60, cfg=cfg)
    assert [e.severity for e in events if e.signal == "time_to_oom"] == ["critical"]


def test_a_request_larger_than_the_gpu_is_not_called_a_full_gpu():
    # On the H200: a 279.6 GiB request failed with 138.3 GiB of 139.8 GiB free.
    from gpuwatch.model import OomSample
    from gpuwatch.signals.process_oom import message

    gib = 1 << 30
    huge = OomSample(pid=9, t=1.0, name="python3", request_bytes=int(279.6 * gib),
                     device_free_bytes=int(138.3 * gib), device_total_bytes=int(139.8 * gib),
                     reserved_bytes=gib, cause="full", outcome="caught")
    text = message(huge, 0, None, None)
    assert "larger than the whole GPU" in text and "was full" not in text
    full = OomSample(pid=9, t=1.0, name="python3", request_bytes=256 << 20,
                     device_free_bytes=37 << 20, device_total_bytes=int(139.8 * gib),
                     reserved_bytes=139 * gib, cause="full", outcome="raised")
    assert "the GPU was full (this process reserved 139.00 GiB)" in message(full, 0, None, None)
