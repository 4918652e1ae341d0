"""Engine scrapes are analyzed as they land, in engine-only ticks that only the engine
analyzer reads, live and in replay."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuwatch.config import load
from gpuwatch.engine_feed import EngineFeed
from gpuwatch.model import EngineSample, GpuSample, ProcessSample, Tick
from gpuwatch.signals.pipeline import Engines, Pipeline
from gpuwatch.thresholds import load_table

VLLM = (Path(__file__).parent / "fixtures" / "engines" / "vllm-0.33.0-statlogger.prom").read_text()


def test_each_batch_of_scrapes_is_one_engine_only_tick():
    ticks: list[Tick] = []

    async def go():
        async def run_tick(tick):
            ticks.append(tick)
        feed = EngineFeed(run_tick, clock=lambda: 100.0)
        task = asyncio.create_task(feed.run())
        feed.put(EngineSample(name="a", exposition=VLLM))
        await asyncio.sleep(0.01)
        feed.put(EngineSample(name="a", exposition=VLLM))
        feed.put(EngineSample(name="b", exposition=VLLM))
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    assert [[s.name for s in t.engines] for t in ticks] == [["a"], ["a", "b"]]
    assert all(t.engines_only and t.gpus == [] and t.t == 100.0 for t in ticks)


def test_an_engine_only_tick_says_nothing_about_the_gpus():
    pipeline = Pipeline(load(None, environ={}), load_table(None))
    gpu = GpuSample(index=0, uuid="GPU-0", memory_total_bytes=80 << 30,
                    memory_used_bytes=10 << 30,
                    processes=[ProcessSample(pid=7, used_memory_bytes=9 << 30)])
    pipeline.update(Tick(t=0.0, gpus=[gpu]))
    calls = []
    host = [a for a in pipeline.analyzers if not isinstance(a, Engines)]
    assert len(host) >= 2  # memory, fragmentation, OOMs...
    for a in host:
        a.update = (lambda f: lambda *args: calls.append(f) or f(*args))(a.update)
    before = (dict(pipeline.derived.gpus), dict(pipeline.derived.processes))
    pipeline.update(Tick(t=1.0, engines=[EngineSample(name="v", exposition=VLLM, t=1.0)],
                         engines_only=True))
    assert (pipeline.derived.gpus, pipeline.derived.processes) == before  # not lost, not fed
    assert pipeline.derived.engines["v"].up and calls == []
    pipeline.update(Tick(t=2.0, gpus=[gpu]))
    assert len(calls) == len(host)
    # a host tick with no GPUs (the driver gone) is still one: it is not engines_only
    assert not Tick(t=3.0).engines_only
