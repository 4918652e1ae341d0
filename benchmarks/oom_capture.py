"""What the OOM flight recorder's own work costs the host thread at an OOM, without a GPU:
summarising an allocator snapshot of a given shape, classifying it and writing the record
(gpuwatch/probe_agent/oom.py over a stand-in for torch whose memory_stats and
memory_snapshot cost nothing). torch's own part, memory_stats() and
memory_snapshot(include_traces=False), comes on top: on the H200 it is in the records the GPU
test writes (capture_seconds, tests/gpu/test_oom_gpu.py).

Shapes: a serving process (73 segments, the H200 figure), a leak of 256 MiB tensors into a
140 GiB GPU (560 segments), the GPU test's fragmented fill (70 segments of 2 GiB refilled with
20 MiB blocks, every other one freed: 7000 blocks), and the summary's bound (50 000 blocks).

    python -m benchmarks.oom_capture [--rounds 50] [--json OUT]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

from benchmarks.report import emit
from gpuwatch.probe_agent.oom import OomRecorder
from gpuwatch.probe_channel import protocol
from gpuwatch.probe_channel.config import ProbeConfig
from tests.fake_torch_oom import GIB, MIB, FakeTorch, fragmented, segment


class Cheap(FakeTorch):
    """Snapshots built once: the time measured is gpuwatch's, not the stand-in's copying."""

    def memory_snapshot(self, mempool_id=None, include_traces=True) -> list:
        return self.segments


def shapes() -> dict[str, list[dict]]:
    serving = [segment(2 * GIB, [(1500 * MIB, "active_allocated"), (548 * MIB, "inactive")])
               for _ in range(13)] + [segment(2 * MIB, [(MIB, "active_allocated"),
                                                        (MIB, "inactive")], kind="small")
                                      for _ in range(60)]
    leak = [segment(256 * MIB, [(256 * MIB, "active_allocated")]) for _ in range(560)]
    return {"serving_73_segments": serving, "leak_560_segments": leak,
            "fragmented_7000_blocks": fragmented(70), "bound_50000_blocks": fragmented(490)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    out: dict = {"machine": platform.node(), "cpus": os.cpu_count(), "rounds": args.rounds,
                 "python": platform.python_version(), "seconds_per_oom": {}}
    with tempfile.TemporaryDirectory() as d:
        for name, segs in shapes().items():
            torch = Cheap(free=20 * MIB, segments=segs)
            took = []
            for r in range(args.rounds):
                rec = OomRecorder(torch, ProbeConfig(oom_max_records=256), os.getpid(), None,
                                  open_dir=lambda: protocol.open_dir(d))
                rec.watch.open = lambda reset=True: False
                rec.records = r % 200
                t0 = time.perf_counter()
                rec.on_oom(0, 60 * MIB, torch.total, torch.free)
                took.append(time.perf_counter() - t0)
                rec.close(exited=False)
            out["seconds_per_oom"][name] = {
                "blocks": sum(len(s["blocks"]) for s in segs), "segments": len(segs),
                "median": statistics.median(took), "max": max(took),
                "record_bytes": max(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)),
            }
    emit(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
