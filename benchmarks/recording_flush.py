"""What flushing a .gz recording more often costs: file size and CPU per tick.

    python -m benchmarks.recording_flush [--scenario large] [--ticks 600] [--json FILE]

Ticks of a simulated host at 1 s are generated once, then written through `Recorder` with
each flush period; a SIGKILL loses at most one period. Only the write path is timed.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

from benchmarks.report import emit
from gpuwatch.model import Tick
from gpuwatch.recording import GZIP_FLUSH_SECONDS, Recorder, read_recording
from gpuwatch.sources.simulate import SimulatedBackend

PERIODS = (0.0, 1.0, 2.0, GZIP_FLUSH_SECONDS, 10.0, 30.0)


def make_ticks(scenario: str, n: int) -> list[Tick]:
    backend = SimulatedBackend(scenario, interval=1.0)
    t0 = time.time()
    return [Tick(t=t0 + k, gpus=backend.sample(t0 + k), probes=backend.probes(t0 + k))
            for k in range(n)]


def measure(ticks: list[Tick], period: float, directory: str) -> dict:
    path = os.path.join(directory, f"r-{period}.jsonl.gz")
    cpu0 = time.process_time()
    rec = Recorder(path, host="bench", interval_s=1.0, gzip_flush_seconds=period)
    for tick in ticks:
        rec.write(tick)
    rec.close()
    cpu = time.process_time() - cpu0
    size = os.path.getsize(path)
    assert sum(1 for _ in read_recording(path)[1]) == len(ticks)
    os.unlink(path)
    return {"flush_seconds": period, "bytes": size,
            "bytes_per_tick": round(size / len(ticks)),
            "cpu_ms_per_tick": round(cpu / len(ticks) * 1e3, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="large")
    ap.add_argument("--ticks", type=int, default=600)
    ap.add_argument("--json")
    args = ap.parse_args()
    ticks = make_ticks(args.scenario, args.ticks)
    with tempfile.TemporaryDirectory() as d:
        rows = [measure(ticks, p, d) for p in PERIODS]
    base = next(r for r in rows if r["flush_seconds"] == 30.0)
    for r in rows:
        r["size_vs_30s"] = round(r["bytes"] / base["bytes"], 3)
    emit({"benchmark": "recording_flush", "scenario": args.scenario, "ticks": args.ticks,
          "default_flush_seconds": GZIP_FLUSH_SECONDS, "machine": platform.node(),
          "cpus": os.cpu_count(), "python": platform.python_version(),
          "date": time.strftime("%Y-%m-%d", time.gmtime()), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
