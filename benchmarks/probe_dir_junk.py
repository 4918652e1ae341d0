"""/metrics latency while a user fills their probe directory with junk.

    python -m benchmarks.probe_dir_junk [--scrapes 1500] [--files 10000] [-o FILE]

A real daemon (simulated GPUs; one simulated process is a real sleeping child with a real
probe record, and the daemon reads the probe directory as it does on a GPU host) is scraped
at random moments, first with only that record in its user's directory, then with `--files`
sparse 256 KB `<pid>.json` files added there: names of every live pid and of pids that do
not run. Reports the scrape latency quantiles of both phases and their ratio; the goal is
p99 within 2x of the baseline.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.report import emit
from tests.helpers import Proc, child_env, free_port, http_get, wait_until

# The simulated backend publishes its own probe samples; here the daemon must read the
# directory, as with real GPUs.
LAUNCH = ("import sys, gpuwatch.sources.simulate as s; "
          "s.SimulatedBackend.probes = lambda self, now: None; "
          "from gpuwatch.cli import main; main()")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def scrape(port: int, n: int, max_gap: float, rng: random.Random) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times = []
    for _ in range(n):
        time.sleep(rng.uniform(0, max_gap))
        t0 = time.perf_counter()
        conn.request("GET", "/metrics")
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    conn.close()
    return times


def probe_series(port: int) -> int:
    """Allocator series of the probed process in /metrics: the record was read."""
    body = http_get(f"http://127.0.0.1:{port}/metrics")[1].decode()
    return sum(1 for line in body.splitlines()
               if line.startswith("gpuwatch_process_allocator_reserved_bytes{"))


def junk_names(files: int) -> list[str]:
    live = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
    dead = [4_000_000 + i for i in range(max(files - len(live), 0))]  # above pid_max
    return [f"{p}.json" for p in live + dead][:files]


def publish(d: Path, pid: int) -> None:
    """A probe record for pid (rewritten every second by the caller's thread)."""
    rec = {"format": "gpuwatch-probe", "version": 1, "pid": pid, "t": time.time(),
           "create_time": psutil.Process(pid).create_time(), "interval_seconds": 1.0,
           "samples": [{"pid": pid, "device": 0, "allocated_bytes": 1 << 30,
                        "reserved_bytes": 2 << 30, "inactive_split_bytes": 1 << 28}]}
    tmp = d / f".{pid}.json.tmp"
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, d / f"{pid}.json")


def fill(d: Path, names: list[str]) -> int:
    made = 0
    for name in names:
        try:
            fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        os.ftruncate(fd, 256 * 1024)
        os.close(fd)
        made += 1
    return made


def phase(stats: dict, name: str, times: list[float]) -> None:
    stats[f"{name}_p50_ms"] = round(pct(times, 0.5) * 1e3, 3)
    stats[f"{name}_p99_ms"] = round(pct(times, 0.99) * 1e3, 3)
    stats[f"{name}_max_ms"] = round(max(times) * 1e3, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=1500)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--max-gap", type=float, default=0.02)
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        probe_dir = work / "probe"
        user_dir = probe_dir / str(os.geteuid())
        user_dir.mkdir(parents=True, mode=0o700)
        cfg = work / "gpuwatch.toml"
        worker = subprocess.Popen(["sleep", "3600"])
        cfg.write_text(f'simulate_pids = {{ "reranker" = {worker.pid} }}\n\n'
                       f'[probe]\ndir = "{probe_dir}"\n\n[nvml]\nfast_interval_seconds = 1.0\n')
        port = free_port()
        d = Proc([sys.executable, "-c", LAUNCH, "run", "--simulate", "mixed", "--listen",
                  f"127.0.0.1:{port}", "--config", str(cfg)], work, "gpuwatch",
                 env=child_env(STATE_DIRECTORY=str(work / "state")))
        stop = threading.Event()

        def prober():  # the worker's probe, publishing once a second
            while not stop.wait(1.0):
                publish(user_dir, worker.pid)
        publish(user_dir, worker.pid)
        threading.Thread(target=prober, daemon=True).start()
        try:
            wait_until(lambda: http_get(f"http://127.0.0.1:{port}/readyz", 1.0)[0] == 200,
                       30, what="daemon ready")
            time.sleep(2)
            stats: dict = {}
            phase(stats, "baseline", scrape(port, args.scrapes, args.max_gap, rng))
            stats["probe_samples_read"] = probe_series(port)
            names = [n for n in junk_names(args.files) if n != f"{worker.pid}.json"]
            stats["junk_files"] = fill(user_dir, names)
            time.sleep(3)
            phase(stats, "junk", scrape(port, args.scrapes, args.max_gap, rng))
            stats["probe_samples_read_with_junk"] = probe_series(port)
            stats["junk_files_left"] = sum(1 for _ in os.scandir(user_dir)) - 1
            stats["p99_ratio"] = round(stats["junk_p99_ms"] / stats["baseline_p99_ms"], 2)
        finally:
            stop.set()
            d.stop()
            worker.kill()
            worker.wait()
    emit({"machine": f"{platform.machine()} {os.cpu_count()} cpus python "
                     f"{platform.python_version()}",
          "date": time.strftime("%Y-%m-%d", time.gmtime()),
          "command": "python -m benchmarks.probe_dir_junk " + " ".join(sys.argv[1:]),
          "scrapes_per_phase": args.scrapes, **stats}, args.output)


if __name__ == "__main__":
    main()
