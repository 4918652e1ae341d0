"""A process first seen holding what it loaded (the daemon started on a busy host, or found
it after its load) is judged once it pauses; one first seen with a CUDA context alone may
still be about to load, and its load stays quiet. The shape of tests/gpu/test_leak_gpu.py,
replayed through the pipeline."""

from __future__ import annotations

import pytest

from gpuwatch.config import load
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.thresholds import load_table

MIB, GIB = 1 << 20, 1 << 30
T0 = 1_800_000_000.0
CONTEXT = 520 * MIB  # what torch's CUDA context holds on an H200


def run(memory, seconds: int, config=None, step: int = 1) -> list:
    """The firing leak events of one process whose memory is memory(seconds since T0),
    sampled every step seconds."""
    pipeline = Pipeline(load(None, environ={}, overrides=config or {}), load_table())
    events = []
    for i in range(0, seconds, step):
        v = int(memory(i))
        proc = ProcessSample(pid=11, name="python3", create_time=T0 - 3, used_memory_bytes=v)
        gpu = GpuSample(index=0, uuid="GPU-f", name="NVIDIA H200",
                        memory_total_bytes=143771 * MIB, memory_used_bytes=v + 600 * MIB,
                        processes=[proc])
        events += [e for e in pipeline.update(Tick(t=T0 + i, gpus=[gpu]))
                   if e.signal == "memory_leak" and e.state == "firing"]
    return events


@pytest.mark.parametrize("hold", [45, 120])
def test_found_loaded_then_leaking_50_mib_s_is_critical_within_60_s(hold):
    def memory(t):  # 1 GiB allocated before the first sample, then 50 MiB/s in 4 MiB steps
        base = CONTEXT + GIB
        return base if t < hold else base + 4 * MIB * int(50 * (t - hold) / 4)

    events = run(memory, hold + 75)
    critical = [e for e in events if e.pid == 11 and e.severity == "critical"]
    assert critical, events
    assert critical[0].t - (T0 + hold) <= 60


def test_found_with_its_context_alone_then_loading_its_weights_is_quiet():
    def memory(t):  # downloads for a minute, then 8 GiB in 512 MiB shards 3 s apart
        if t < 60:
            return CONTEXT
        return CONTEXT + 512 * MIB * min(16, 1 + (t - 60) // 3)

    assert run(memory, 600) == []


def test_a_pause_before_the_load_does_not_end_it():
    """A server that starts its CUDA context, allocates a little, then waits a minute
    (downloading, compiling) before a slow smooth load at 100 MiB/s for 3 min: the pause
    came before memory grew, so the load is still loading, not a critical leak."""
    def memory(t):
        if t < 60:
            return CONTEXT + 100 * MIB * min(1.0, t / 5)
        return CONTEXT + 100 * MIB + 100 * MIB * min(180, t - 60)

    assert run(memory, 900) == []
