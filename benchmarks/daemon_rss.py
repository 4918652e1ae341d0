"""Daemon RSS over time (goal: < 60 MB after 10 minutes).

    python -m benchmarks.daemon_rss [--minutes 10] [--simulate mixed] [--scrape-every 2]

Prometheus-like load: /metrics is scraped every few seconds while the daemon runs.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import psutil

from benchmarks.report import emit
from tests.helpers import Daemon, http_get


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--simulate", default="")
    ap.add_argument("--scrape-every", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--simulate", args.simulate] if args.simulate else []
        d = Daemon(pathlib.Path(tmp), *extra)
        proc = psutil.Process(d.proc.pid)
        samples = []
        start = time.monotonic()
        try:
            while time.monotonic() - start < args.minutes * 60:
                http_get(d.url + "/metrics")
                samples.append((round(time.monotonic() - start), proc.memory_info().rss))
                time.sleep(args.scrape_every)
        finally:
            d.stop()
    res = {
        "backend": args.simulate or "nvml",
        "minutes": args.minutes,
        "rss_mb_start": samples[0][1] / 1e6,
        "rss_mb_end": samples[-1][1] / 1e6,
        "rss_mb_max": max(s[1] for s in samples) / 1e6,
        "rss_mb_by_minute": {str(int(t // 60)): round(r / 1e6, 1) for t, r in samples},
    }
    emit(res)


if __name__ == "__main__":
    main()
