"""The daemon's own CPU cost on a simulated host (goal for 8 GPUs x 64 processes at 1 s
sampling: < 1 % of one core).

    python -m benchmarks.daemon_cpu [--simulate large] [--seconds 120] [--interval 1]
                                    [--scrape-every 15] [--json FILE]

A real daemon process runs `--simulate SCENARIO` with `fast_interval_seconds = INTERVAL`
and is scraped like Prometheus would, every `--scrape-every` seconds. Its CPU time (user +
system, from the kernel) over the measured window includes the simulator, which on a real
host is NVML's and the engines' side. So the simulator's own cost is measured apart, over
the same window, by a process that produces the same ticks with the same backend on the
same cadence (a tick, then sleep: caches go cold between ticks in both); the daemon's own
cost is the difference. The simulator's cost in a hot loop is reported too: it is lower,
and subtracting it would charge the simulator's cold-cache cost to the daemon. No GPU is
needed: on a GPU host this measures that host's CPU.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import psutil

from benchmarks.report import emit
from gpuwatch.sources.simulate import SimulatedBackend
from tests.helpers import Daemon, http_get

SLOW_EVERY = 30.0  # the slow tier's default interval


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


def paced_simulator(scenario: str, interval: float, slow_every: float) -> None:
    """The simulator's work alone, on the daemon's cadence (one tick, then sleep): run in a
    process of its own, its CPU time is what the simulator costs inside the daemon, cold
    caches after each sleep included, which a hot loop does not see."""
    backend = SimulatedBackend(scenario, interval=interval)
    k, t0 = 0, time.monotonic()
    while True:
        now = time.time()
        backend.sample(now)
        backend.probes(now)
        backend.engines(now)
        if k % max(1, round(slow_every / interval)) == 0:
            backend.sample_slow(now)
        k += 1
        time.sleep(max(0.0, t0 + k * interval - time.monotonic()))


def _cpu(proc: psutil.Process) -> float:
    c = proc.cpu_times()
    return c.user + c.system


def daemon_cost(scenario: str, interval: float, seconds: float, scrape_every: float,
                warmup: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(pathlib.Path(tmp), "--simulate", scenario,
                   config_toml=f"[nvml]\nfast_interval_seconds = {interval}\n")
        sim = subprocess.Popen([sys.executable, "-m", "benchmarks.daemon_cpu", "--paced",
                                "--simulate", scenario, "--interval", str(interval)],
                               cwd=pathlib.Path(__file__).resolve().parent.parent)
        try:
            proc, sim_proc = psutil.Process(d.proc.pid), psutil.Process(sim.pid)
            end_warmup = time.monotonic() + warmup
            while time.monotonic() < end_warmup:
                http_get(d.url + "/metrics")
                time.sleep(scrape_every)
            c0, s0, w0 = _cpu(proc), _cpu(sim_proc), time.monotonic()
            scrapes = 0
            while time.monotonic() - w0 < seconds:
                http_get(d.url + "/metrics")
                scrapes += 1
                time.sleep(min(scrape_every, max(0.0, seconds - (time.monotonic() - w0))))
            c1, s1, w1 = _cpu(proc), _cpu(sim_proc), time.monotonic()
            rss = proc.memory_info().rss
        finally:
            sim.kill()
            sim.wait()
            d.stop()
    return {"cpu_seconds": round(c1 - c0, 3), "wall_seconds": round(w1 - w0, 3),
            "paced_simulator_cpu_seconds": round(s1 - s0, 3),
            "scrapes": scrapes, "rss_mb": round(rss / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--simulate", default="large")
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--scrape-every", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--json")
    ap.add_argument("--paced", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.paced:
        paced_simulator(args.simulate, args.interval, SLOW_EVERY)
        return
    run = daemon_cost(args.simulate, args.interval, args.seconds, args.scrape_every,
                      args.warmup)
    ticks = max(1, round(run["wall_seconds"] / args.interval))
    sim = simulator_cost(args.simulate, args.interval, min(ticks, 300), SLOW_EVERY)
    total_pct = 100 * run["cpu_seconds"] / run["wall_seconds"]
    sim_pct = 100 * run["paced_simulator_cpu_seconds"] / run["wall_seconds"]
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
        "simulator_ms_per_tick_hot_loop": round(sim * 1e3, 3),
        "simulator_percent_of_a_core": round(sim_pct, 3),
        "daemon_own_percent_of_a_core": round(total_pct - sim_pct, 3),
    }, args.json)


if __name__ == "__main__":
    main()
