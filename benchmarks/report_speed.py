"""`gpuwatch report` over a 24 h recording at 5 s (goal: seconds, not minutes).

    python -m benchmarks.report_speed [--hours 24] [--interval 5] [--engine-every 1]

The recording is the one `benchmarks.replay_speed` builds (the simulated `mixed` host with
vLLM 0.33.0's exposition); the report runs the same replay pipeline and draws the plots.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time

from benchmarks.replay_speed import build
from gpuwatch.config import load
from gpuwatch.views.report import build as build_report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--interval", type=float, default=5)
    ap.add_argument("--engine-every", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "day.jsonl.gz")
        ticks = build(path, args.hours, args.interval, args.engine_every)
        cfg = load(None, environ={})
        t0 = time.perf_counter()
        page = build_report(path, cfg)
        elapsed = time.perf_counter() - t0
    json.dump({
        "machine": f"{platform.machine()} python {platform.python_version()}",
        "ticks": ticks, "engine_every": args.engine_every,
        "report_seconds": round(elapsed, 2),
        "per_tick_ms": round(elapsed / ticks * 1e3, 3),
        "html_bytes": len(page),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
