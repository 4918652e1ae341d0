"""What one tick of the analyzers and one /metrics render cost on a simulated host, in
process, with the simulator's work done beforehand (it is not the daemon's).

    python -m benchmarks.pipeline_cost [--simulate large] [--interval 1] [--ticks 300]
                                       [--warmup 60] [--json FILE]

The ticks are produced first, then fed to the same Pipeline the daemon runs; the figure
is the best of three rounds of CPU time per tick (a shared machine's noise only adds).
`--rounds 1` with two `--ticks` values under `valgrind --tool=callgrind` gives an exact
instruction count per tick (the difference of the two runs over the difference of ticks).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from benchmarks.report import emit
from gpuwatch.config import load
from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import Tick
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.sources.simulate import SimulatedBackend


def ticks_of(scenario: str, interval: float, n: int) -> list[Tick]:
    backend = SimulatedBackend(scenario, interval=interval)
    t0 = 1.8e9
    out = []
    for k in range(n):
        t = t0 + k * interval
        out.append(Tick(t=t, gpus=backend.sample(t), engines=backend.engines(t),
                        probes=backend.probes(t)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--simulate", default="large")
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--ticks", type=int, default=300, help="measured ticks per round")
    ap.add_argument("--warmup", type=int, default=60, help="ticks fed before measuring")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    cfg = load(None, overrides={"nvml": {"fast_interval_seconds": args.interval}})
    ticks = ticks_of(args.simulate, args.interval, args.warmup + args.rounds * args.ticks)
    pipeline = Pipeline.from_config(cfg)
    for tick in ticks[:args.warmup]:
        pipeline.update(tick)
    per_tick = []
    for r in range(args.rounds):
        part = ticks[args.warmup + r * args.ticks:args.warmup + (r + 1) * args.ticks]
        c0 = time.process_time()
        for tick in part:
            pipeline.update(tick)
        per_tick.append((time.process_time() - c0) / len(part))
    renderer = Renderer()
    renders = []
    for k in range(5):
        snap = Snapshot(version=k + 1, tick=ticks[-1], derived=pipeline.derived, ready=True,
                        config=cfg)
        c0 = time.process_time()
        body = renderer.render(snap)
        renders.append(time.process_time() - c0)
    last = ticks[-1]
    emit({
        "benchmark": "pipeline_cost",
        "scenario": args.simulate,
        "interval_seconds": args.interval,
        "gpus": len(last.gpus),
        "processes": sum(len(g.processes) for g in last.gpus),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "pipeline_ms_per_tick": round(min(per_tick) * 1e3, 3),
        "pipeline_ms_per_tick_rounds": [round(x * 1e3, 3) for x in per_tick],
        "render_ms": round(min(renders) * 1e3, 3),
        "render_bytes": len(body),
    }, args.json)


if __name__ == "__main__":
    main()
