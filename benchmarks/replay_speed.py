"""`gpuwatch replay` over a 24 h recording at 5 s (goal: < 20 s); with --report, also
`gpuwatch report` of it (goal: seconds).

    python -m benchmarks.replay_speed [--hours 24] [--interval 5] [--engine-every 1] [--report]

The recording is built from the simulated `mixed` host (4 GPUs, 8 processes, probes) with
vLLM 0.33.0's own 57 KB exposition (the two fixture scrapes, counters advanced every tick)
attached every `--engine-every` ticks, kept as the engine source keeps it (`compact`), then
replayed through the same code as the CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

from gpuwatch.config import load
from gpuwatch.exposition import compact
from gpuwatch.model import EngineSample, Tick
from gpuwatch.recording import Recorder
from gpuwatch.replay import iter_events
from gpuwatch.sources.simulate import SimulatedBackend

FIXTURE = Path(__file__).resolve().parent.parent / "tests/fixtures/engines"
_COUNTER = re.compile(r"^(vllm:prefix_cache_(?:queries|hits)_total\{[^}]*\}) (\S+)$", re.M)


def advance(text: str, k: int) -> str:
    """The scrape k ticks later: prefix-cache counters grow (hits 60 % of queries)."""
    def bump(m):
        step = 1000 if "queries" in m.group(1) else 600
        return f"{m.group(1)} {float(m.group(2)) + step * k}"
    return _COUNTER.sub(bump, text)


def build(path: str, hours: float, interval: float, engine_every: int) -> int:
    backend = SimulatedBackend("mixed")
    texts = [(FIXTURE / n).read_text() for n in
             ("vllm-0.33.0-statlogger.prom", "vllm-0.33.0-statlogger-later.prom")]
    rec = Recorder(path, host="bench", interval_s=interval)
    t0 = 1.8e9
    n = int(hours * 3600 / interval)
    for k in range(n):
        t = t0 + k * interval
        engines = []
        if k % engine_every == 0:
            engines = [EngineSample(name="vllm-0", kind="vllm", url="http://127.0.0.1:8000/metrics",
                                    exposition=compact(advance(texts[k % 2], k)), t=t)]
        rec.write(Tick(t=t, gpus=backend.sample(t), engines=engines, probes=backend.probes(t)))
    rec.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--interval", type=float, default=5)
    ap.add_argument("--engine-every", type=int, default=1)
    ap.add_argument("--report", action="store_true", help="time `gpuwatch report` as well")
    args = ap.parse_args()
    extra: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "day.jsonl.gz")
        ticks = build(path, args.hours, args.interval, args.engine_every)
        size = os.path.getsize(path)
        cfg = load(None, environ={})
        t0 = time.perf_counter()
        events = sum(1 for _ in iter_events(path, cfg))
        elapsed = time.perf_counter() - t0
        if args.report:
            from gpuwatch.views.report import build as build_report

            t1 = time.perf_counter()
            extra["report_bytes"] = len(build_report(path, cfg))
            extra["report_seconds"] = round(time.perf_counter() - t1, 2)
    json.dump({
        "machine": f"{platform.machine()} python {platform.python_version()}",
        "ticks": ticks, "engine_every": args.engine_every,
        "recording_bytes_gz": size, "events": events,
        "replay_seconds": round(elapsed, 2),
        "per_tick_ms": round(elapsed / ticks * 1e3, 3),
        **extra,
    }, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
