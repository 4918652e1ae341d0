"""Time to OOM from the GPU's own memory (signals/projection.py), and what is shown of it."""

from __future__ import annotations

import math

import pytest

from gpuwatch.config import Config
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.thresholds import load_table

MIB = 1 << 20
GIB = 1 << 30
T0 = 1_767_225_600.0
A100 = ("NVIDIA A100-SXM4-80GB", 80 * GIB)
BUDGET = int(0.95 * (80 * GIB - int(2.1 * GIB) - 512 * MIB))  # the A100 row's


def tick(t: float, procs, used: float | None = None) -> Tick:
    ps = [ProcessSample(pid=pid, name=f"p{pid}", used_memory_bytes=int(v), create_time=ct)
          for pid, v, ct in procs]
    if used is None:
        used = sum(v for _, v, _ in procs) + 500 * MIB
    return Tick(t=t, gpus=[GpuSample(index=0, uuid="GPU-0", name=A100[0],
                                     memory_total_bytes=A100[1], memory_used_bytes=int(used),
                                     processes=ps)])


def run(make, seconds: float, dt: float = 2.0):
    pipeline = Pipeline(Config(), load_table())
    events = []
    for i in range(int(seconds / dt)):
        events += pipeline.update(make(i * dt))
    return events, pipeline


def test_several_processes_filling_the_gpu_raise_time_to_oom_before_any_leak_is_judged():
    # four servers found running (each watched a floor window before its own trend is
    # judged), growing 6 MiB/s each from 30 s: 24 MiB/s together, the budget 20 min away
    def make(el):
        grow = 6 * MIB * max(0.0, el - 30)
        return tick(T0 + el, [(10 + i, 14 * GIB + grow, T0 - 7200) for i in range(4)])
    events, pipeline = run(make, 420)
    tto = [e for e in events if e.signal == "time_to_oom"]
    assert tto and tto[0].state == "firing" and tto[0].severity == "critical"
    assert tto[0].t - T0 - 30 <= 240
    assert "projected from its retained memory" in tto[0].message
    assert all(f"pid {10 + i} (p{10 + i}) +" in tto[0].message for i in range(3))
    assert not [e for e in events if e.signal == "memory_leak"]
    gpu = pipeline.derived.gpus["GPU-0"]
    used = 4 * (14 * GIB + 6 * MIB * (418 - 30)) + 500 * MIB
    assert gpu.time_to_oom_seconds == pytest.approx((BUDGET - used) / (24 * MIB), rel=0.2)
    assert gpu.headroom_bytes == pytest.approx(BUDGET - used, rel=0.01)


def test_a_model_that_loads_is_not_projected_to_an_oom():
    # 70 GiB in 512 MiB bursts at about 1 GiB/s next to a flat 2 GiB process: the GPU fills
    # to 72 GiB of its 73.5, and stops
    def make(el):
        loaded = min(70 * GIB, 512 * MIB * math.floor(el * 2))
        return tick(T0 + el, [(11, 2 * GIB, T0 - 7200), (12, 300 * MIB + loaded, T0 + 0.5)])
    events, _ = run(make, 600)
    assert [e for e in events if e.signal in ("time_to_oom", "memory_leak")] == []


def test_a_load_is_not_projected_even_where_its_pace_would_fill_the_gpu():
    # a smooth load of 200 MiB/s next to 30 GiB: at that pace the budget is 3.6 min away,
    # sooner than a load may go on (loading_max_seconds), but a load ends where its weights
    # end (here at 30 GiB, 2.5 min in): a restart on a full GPU loading again is no OOM
    def make(el):
        return tick(T0 + el, [(11, 30 * GIB, T0 - 7200),
                              (12, 300 * MIB + min(30 * GIB, 200 * MIB * el), T0 + 0.5)])
    events, _ = run(make, 900)
    assert [e for e in events if e.signal in ("time_to_oom", "memory_leak")] == []


def test_growth_that_never_pauses_is_projected_once_it_is_no_load():
    # the same pace that never stops: once past loading_max_seconds it is growth like any
    # other, and the GPU's projection names it
    def make(el):
        return tick(T0 + el, [(11, 30 * GIB, T0 - 7200),
                              (12, 300 * MIB + 60 * MIB * el, T0 + 0.5)])
    events, _ = run(make, 600)
    tto = [e for e in events if e.signal == "time_to_oom" and e.state == "firing"]
    assert tto and tto[0].severity == "critical", events


def test_a_process_that_exits_or_starts_is_not_growth_of_the_gpu():
    # a restart loop: a 6 GiB process exits every 90 s and a new pid loads 6 GiB again
    def make(el):
        gen, age = divmod(el, 90.0)
        v = 300 * MIB + min(6 * GIB, 512 * MIB * math.floor(age))
        return tick(T0 + el, [(11, 20 * GIB, T0 - 7200), (100 + int(gen), v, T0 + gen * 90)])
    events, pipeline = run(make, 1200)
    assert [e for e in events if e.signal in ("time_to_oom", "memory_leak")] == []
    assert pipeline.derived.gpus["GPU-0"].time_to_oom_seconds == math.inf


def test_time_to_oom_is_shown_only_where_memory_rises_beyond_its_noise():
    # a healthy process creeping 0.3 MiB/min, another flat with churn: +Inf for both and
    # for the GPU, not "29.9 d"
    def make(el):
        churn = 800 * MIB if int(el) % 6 < 2 else 0
        return tick(T0 + el, [(11, 20 * GIB + 0.3 * MIB / 60 * el, T0 - 7200),
                              (22, 10 * GIB + churn, T0 - 7200)])
    events, pipeline = run(make, 3600)
    d = pipeline.derived
    assert d.processes[("GPU-0", 11)].time_to_oom_seconds == math.inf
    assert d.processes[("GPU-0", 22)].time_to_oom_seconds == math.inf
    assert d.gpus["GPU-0"].time_to_oom_seconds == math.inf
    assert d.processes[("GPU-0", 11)].leak_rate_bytes_per_second == 0.0
    assert [e for e in events if e.signal in ("time_to_oom", "memory_leak")] == []


def test_a_gpu_past_its_budget_says_so():
    # already over the budget, and still growing 2 MiB/s: time to OOM 0, the event says
    # the budget is spent (not "OOM in 0 s")
    over = BUDGET + 2 * GIB
    def make(el):
        return tick(T0 + el, [(11, over - 500 * MIB + 2 * MIB * el, T0 - 7200)])
    events, pipeline = run(make, 600)
    tto = [e for e in events if e.signal == "time_to_oom" and e.state == "firing"]
    assert tto and tto[0].value == 0.0 and tto[0].severity == "critical"
    assert tto[0].message.startswith("GPU 0 is over its memory budget by ")
    assert "in 0 s" not in tto[0].message
    gpu = pipeline.derived.gpus["GPU-0"]
    assert gpu.time_to_oom_seconds == 0.0 and gpu.headroom_bytes < -2 * GIB
