"""Daemon RSS with and without OTLP push, side by side in one run (the same scenario, both
scraped; the OTLP one pushes to Debian 13's VictoriaMetrics on loopback every second).

    python -m benchmarks.otlp_rss [--minutes 3] [--simulate large] [-o FILE]
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import psutil

from benchmarks.report import emit
from tests.helpers import Daemon, http_get
from tests.realservers.victoria_metrics import VictoriaMetrics

CONFIG = """
[otlp]
endpoint = "{url}"
interval_seconds = 1.0
timeout_seconds = 1.0
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=3)
    ap.add_argument("--simulate", default="large")
    ap.add_argument("-o", dest="out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        vm = VictoriaMetrics(pathlib.Path(tmp))
        daemons = {"off": Daemon(pathlib.Path(tmp), "--simulate", args.simulate),
                   "otlp": Daemon(pathlib.Path(tmp), "--simulate", args.simulate,
                                  config_toml=CONFIG.format(url=vm.otlp))}
        procs = {k: psutil.Process(d.proc.pid) for k, d in daemons.items()}
        samples: dict[str, list[int]] = {k: [] for k in daemons}
        start = time.monotonic()
        try:
            while time.monotonic() - start < args.minutes * 60:
                for k, d in daemons.items():
                    http_get(d.url + "/metrics")
                    samples[k].append(procs[k].memory_info().rss)
                time.sleep(2)
            pushed = [ln for ln in daemons["otlp"].metrics().splitlines()
                      if ln.startswith("gpuwatch_otlp_pushed_requests_total")]
        finally:
            for d in daemons.values():
                d.stop()
            vm.stop()
    emit({"scenario": args.simulate, "minutes": args.minutes, "otlp_interval_seconds": 1.0,
          "otlp_pushed": pushed,
          **{f"rss_mb_{k}_end": round(v[-1] / 1e6, 1) for k, v in samples.items()},
          **{f"rss_mb_{k}_max": round(max(v) / 1e6, 1) for k, v in samples.items()}},
         args.out)


if __name__ == "__main__":
    main()
