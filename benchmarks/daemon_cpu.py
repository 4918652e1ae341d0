"""The daemon's own CPU cost on a simulated host (goal for 8 GPUs x 64 processes at 1 s
sampling: < 1 % of one core).

    python -m benchmarks.daemon_cpu [--simulate large] [--seconds 120] [--interval 1]
                                    [--scrape-every 15] [--json FILE]

A real daemon process runs `--simulate SCENARIO` with `fast_interval_seconds = INTERVAL`
and is scraped like Prometheus would, every `--scrape-every` seconds. Its CPU time (user +
system, from the kernel) over the measured window includes the simulator, which on a real
host is NVML's and the engines' side. So the simulator's own cost is measured apart, in
this process, by producing the same ticks with the same backend; the daemon's own cost is
the difference. No GPU is needed: on a GPU host this measures that host's CPU.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import tempfile
import time

import psutil

from benchmarks.report import emit
from gpuwatch.sources.simulate import SimulatedBackend
from tests.helpers import Daemon, http_get


def simulator_cost(scenario: str, interval: float, ticks: int, slow_every: float) -> float:
    """CPU seconds per tick that producing one tick of the scenario costs."""
    backend = SimulatedBackend(scenario, interval=interval)
    t0 = time.time()
    for k in range(3):
        backend.sample(t0 + k)
    c0 = time.process_time()
    for k in range(ticks):
        now = t0 + k * interval
        backend.sample(now)
        backend.probes(now)
        backend.engines(now)
        if slow_every and k % max(1, round(slow_every / interval)) == 0:
            backend.sample_slow(now)
    return (time.process_time() - c0) / ticks


def daemon_cost(scenario: str, interval: float, seconds: float, scrape_every: float,
                warmup: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(pathlib.Path(tmp), "--simulate", scenario,
                   config_toml=f"[nvml]\nfast_interval_seconds = {interval}\n")
        try:
            proc = psutil.Process(d.proc.pid)
            end_warmup = time.monotonic() + warmup
            while time.monotonic() < end_warmup:
                http_get(d.url + "/metrics")
                time.sleep(scrape_every)
            c0, w0 = proc.cpu_times(), time.monotonic()
            scrapes = 0
            while time.monotonic() - w0 < seconds:
                http_get(d.url + "/metrics")
                scrapes += 1
                time.sleep(min(scrape_every, max(0.0, seconds - (time.monotonic() - w0))))
            c1, w1 = proc.cpu_times(), time.monotonic()
            rss = proc.memory_info().rss
        finally:
            d.stop()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {"cpu_seconds": round(cpu, 3), "wall_seconds": round(w1 - w0, 3),
            "scrapes": scrapes, "rss_mb": round(rss / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--simulate", default="large")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--scrape-every", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    run = daemon_cost(args.simulate, args.interval, args.seconds, args.scrape_every,
                      args.warmup)
    ticks = max(1, round(run["wall_seconds"] / args.interval))
    sim = simulator_cost(args.simulate, args.interval, min(ticks, 300), 30.0)
    total_pct = 100 * run["cpu_seconds"] / run["wall_seconds"]
    sim_pct = 100 * sim / args.interval
    emit({
        "benchmark": "daemon_cpu",
        "scenario": args.simulate,
        "interval_seconds": args.interval,
        "scrape_every_seconds": args.scrape_every,
        "machine": platform.node(),
        "cpu_model": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        **run,
        "process_cpu_percent_of_a_core": round(total_pct, 3),
        "simulator_ms_per_tick": round(sim * 1e3, 3),
        "simulator_percent_of_a_core": round(sim_pct, 3),
        "daemon_own_percent_of_a_core": round(total_pct - sim_pct, 3),
    }, args.json)


if __name__ == "__main__":
    main()
