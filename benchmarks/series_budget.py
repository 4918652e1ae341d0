"""Series per host, with the series budget at its defaults and without it (every process its
own series), for the simulated hosts: real daemons, their /metrics counted.

    python -m benchmarks.series_budget [--scenarios mixed large kubernetes] [-o FILE]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.report import emit
from tests.helpers import Daemon

CONFIG = "[nvml]\nfast_interval_seconds = 1.0\nslow_interval_seconds = 2.0\n"


def count(scenario: str, budget: bool, settle: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        toml = CONFIG + ("" if budget else "[budget]\nenabled = false\n")
        d = Daemon(Path(tmp), "--simulate", scenario, config_toml=toml)
        try:
            time.sleep(settle)  # the slow tier and the engines' first scrape in
            body = d.metrics()
        finally:
            d.stop()
    series = [line for line in body.splitlines() if line and not line.startswith("#")]
    per_process = [s for s in series if 'pid="' in s]
    families = Counter(s.split("{")[0].split(" ")[0] for s in series)
    return {"series": len(series), "series_with_pid": len(per_process),
            "max_labels": max(s.split("}")[0].count('="') for s in series),
            "top_families": families.most_common(5)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", nargs="+", default=["mixed", "large", "kubernetes"])
    ap.add_argument("--settle", type=float, default=12.0)
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    out = {"machine": f"{os.cpu_count()} vCPU", "scenarios": {}}
    for s in args.scenarios:
        out["scenarios"][s] = {"without_budget": count(s, False, args.settle),
                               "budget_defaults": count(s, True, args.settle)}
    emit(out, args.output)


if __name__ == "__main__":
    main()
