"""A model spread over four GPUs of one host, and one of its GPUs leaks: a tensor-parallel
group (one process per rank, as torchrun and the engines' workers run), or one process that
holds memory on every GPU (a device map, pipeline stages in one process). Each GPU's series
and the processes' rows must be that GPU's own, and the leak must be flagged on the leaking
GPU and pid alone, never on its siblings (same name, start time and load curve)."""

from __future__ import annotations

import random
import re
import sys

import pytest

from gpuwatch.config import load
from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.thresholds import load_table

MIB = 1 << 20
GIB = 1 << 30
T0 = 1_800_000_000.0
TOTAL = 143771 * MIB
GPUS = 4
WEIGHTS = 30 * GIB  # per rank
INTERVAL = 2.0


ONE_PROCESS = False


def ranks_pid(rank: int) -> int:
    return 4100 if ONE_PROCESS else 4100 + rank


def trace(leaky_rank: int, rate_mib_s: float, onset: float, seconds: float):
    rng = random.Random(leaky_rank * 1000 + int(rate_mib_s))
    for i in range(int(seconds / INTERVAL)):
        t = i * INTERVAL
        gpus = []
        for g in range(GPUS):
            loaded = min(1.0, t / 60.0)  # weights in over the first minute, as ranks do
            used = WEIGHTS * loaded + rng.uniform(-8, 8) * MIB
            if g == leaky_rank and t > onset:
                used += rate_mib_s * MIB * (t - onset)
            procs = [ProcessSample(pid=ranks_pid(g), name="python3", create_time=T0 - 5,
                                   used_memory_bytes=int(used))]
            if g == 0:  # a sidecar on rank 0's GPU only, flat
                procs.append(ProcessSample(pid=5000, name="tokenizer", create_time=T0 - 5,
                                           used_memory_bytes=2 * GIB))
            total_used = int(600 * MIB + sum(p.used_memory_bytes for p in procs))
            gpus.append(GpuSample(index=g, uuid=f"GPU-tp-{g}", name="NVIDIA H200",
                                  memory_total_bytes=TOTAL, memory_used_bytes=total_used,
                                  memory_free_bytes=TOTAL - total_used, processes=procs))
        yield Tick(t=T0 + t, gpus=gpus)


def run(leaky_rank: int, rate: float, onset: float, seconds: float):
    cfg = load(None, environ={})
    pipeline = Pipeline(cfg, load_table(None))
    events, tick = [], None
    for tick in trace(leaky_rank, rate, onset, seconds):
        events += pipeline.update(tick)
    snap = Snapshot(version=1, tick=tick, derived=pipeline.derived, ready=True, started=T0,
                    extras={"ticks": {"failures_total": 0}})
    return events, Renderer().render(snap).decode()


@pytest.fixture(params=[False, True], ids=["rank-per-process", "one-process"])
def layout(request, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ONE_PROCESS", request.param)
    return request.param


@pytest.mark.parametrize("leaky_rank, rate, onset", [(2, 20.0, 180.0), (0, 60.0, 120.0),
                                                     (3, 1.0, 120.0)])
def test_a_leak_on_one_rank_is_flagged_on_that_gpu_and_pid_alone(layout, leaky_rank, rate,
                                                                  onset):
    events, _ = run(leaky_rank, rate, onset, seconds=1800 if rate < 5 else 900)
    leaks = [e for e in events if e.signal == "memory_leak" and e.state == "firing"]
    assert leaks, "the leaking rank was never flagged"
    assert {(e.gpu_uuid, e.pid) for e in leaks} <= {
        (f"GPU-tp-{leaky_rank}", ranks_pid(leaky_rank)), (f"GPU-tp-{leaky_rank}", None)}
    assert any(e.pid == ranks_pid(leaky_rank) for e in leaks)
    others = {f"GPU-tp-{g}" for g in range(GPUS)} - {f"GPU-tp-{leaky_rank}"}
    assert not [e for e in events if e.gpu_uuid in others and e.signal in (
        "memory_leak", "time_to_oom")]


def test_each_gpu_exports_its_own_rank_and_memory():  # rank per process
    _, text = run(1, 20.0, 180.0, seconds=400)
    used = dict(re.findall(
        r'^gpuwatch_gpu_memory_used_bytes\{[^}]*uuid="(GPU-tp-\d)"[^}]*\} (\S+)', text, re.M))
    assert set(used) == {f"GPU-tp-{g}" for g in range(GPUS)}
    # rank 1 leaked ~20 MiB/s for ~220 s beyond its siblings' 30 GiB
    extra = float(used["GPU-tp-1"]) - float(used["GPU-tp-3"])
    assert 3.5 * GIB < extra < 5 * GIB
    rows = re.findall(r'^gpuwatch_process_gpu_memory_used_bytes\{([^}]*)\} (\S+)', text, re.M)
    seen = {}
    for labels, value in rows:
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if lab.get("pid"):
            seen[(lab.get("uuid") or lab.get("gpu_uuid"), lab["pid"])] = float(value)
    for g in range(GPUS):
        assert (f"GPU-tp-{g}", str(ranks_pid(g))) in seen  # each rank on its own GPU
        for h in set(range(GPUS)) - {g}:
            assert (f"GPU-tp-{h}", str(ranks_pid(g))) not in seen  # and on no other
    assert ("GPU-tp-0", "5000") in seen and ("GPU-tp-1", "5000") not in seen
