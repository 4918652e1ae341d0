"""The daemon's CPU per tick, and its memory at the window's end, on the NVML path without a
GPU, side by side for several source trees in one run: each daemon runs over one fake GPU
(tests/fake_nvml_daemon.py) whose process list is the same N real processes of this host, so
the per-process work (psutil, probe files, attribution, per-process series) is the real one;
only the driver's calls are Python fakes (on an H200 the real ones cost ~64 us per GPU and tick:
results/h200-nvml-tick.json). Scraped like benchmarks/footprint.py does: from the start of
the window on, every --scrape-every seconds.

    python -m benchmarks.tick_cpu [--tree NAME=DIR ...] [--processes 10] [--seconds 120]
                                  [--warmup 15] [--interval 1] [--scrape-every 15] [--json FILE]

Without --tree, this checkout alone. A tree is a source tree of gpuwatch (an exported commit,
say `git archive REV | tar -x -C DIR`): all daemons run at the same time, so a shared
machine's noise falls on each of them alike.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.report import emit
from tests.helpers import free_port, http_get

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        return http_get(url, timeout)
    except OSError:
        return 0, b""


def _cpu(p: psutil.Process) -> tuple[float, float]:
    """User + system seconds (the kernel's, in clock ticks, as benchmarks/footprint.py reads
    them), and the nanoseconds on a CPU of the threads alive now (schedstat: finer)."""
    t = p.cpu_times()
    ns = 0
    for task in Path(f"/proc/{p.pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            ns += int((task / "schedstat").read_text().split()[0])
    return t.user + t.system, ns / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--processes", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--scrape-every", type=float, default=15.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in args.tree] or [["this", str(REPO)]]
    for name, path in trees:
        if not (Path(path) / "tests" / "fake_nvml_daemon.py").is_file():
            raise SystemExit(f"tick_cpu: {name}: {path} has no tests/fake_nvml_daemon.py")
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)"])
                for _ in range(args.processes)]
    daemons: list[tuple[str, subprocess.Popen, str]] = []
    with tempfile.TemporaryDirectory(prefix="tick-cpu-") as tmp:
        pids = Path(tmp) / "pids"
        pids.write_text("".join(f"{s.pid} {2 * GIB}\n" for s in sleepers))
        try:
            for name, path in trees:
                port = free_port()
                env = {**os.environ, "PYTHONPATH": path, "FAKE_NVML_PIDS_FILE": str(pids),
                       "STATE_DIRECTORY": str(Path(tmp) / f"state-{name}"),
                       "GPUWATCH_NVML_FAST_INTERVAL_SECONDS": str(args.interval)}
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.fake_nvml_daemon", "run", "--listen",
                     f"127.0.0.1:{port}"], cwd=path, env=env, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
                daemons.append((name, proc, f"http://127.0.0.1:{port}"))
            deadline = time.monotonic() + 60
            for name, proc, url in daemons:
                while _get(url + "/readyz", 2.0)[0] != 200:
                    if proc.poll() is not None:
                        raise SystemExit(f"tick_cpu: {name} exited ({proc.returncode})")
                    if time.monotonic() > deadline:
                        raise SystemExit(f"tick_cpu: {name} not ready after 60 s")
                    time.sleep(0.25)
            time.sleep(args.warmup)
            ps = {name: psutil.Process(proc.pid) for name, proc, _ in daemons}
            c0 = {n: _cpu(p) for n, p in ps.items()}
            w0 = time.monotonic()
            lines: dict[str, list[int]] = {n: [] for n in ps}
            while (elapsed := time.monotonic() - w0) < args.seconds:
                for name, _, url in daemons:
                    code, body = _get(url + "/metrics", 10.0)
                    lines[name].append(body.count(b"\n") if code == 200 else -1)
                time.sleep(min(args.scrape_every, args.seconds - elapsed))
            wall = time.monotonic() - w0
            c1 = {n: _cpu(p) for n, p in ps.items()}
            mem = {n: p.memory_full_info() for n, p in ps.items()}
        finally:
            for _, proc, _ in daemons:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
            for s in sleepers:
                s.kill()
                s.wait()
    ticks = wall / args.interval
    emit({
        "benchmark": "tick_cpu",
        "machine": "2 vCPU" if os.cpu_count() == 2 else f"{os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "processes": args.processes, "interval_seconds": args.interval,
        "scrape_every_seconds": args.scrape_every, "window_seconds": round(wall, 1),
        "daemons": {n: {"cpu_seconds": round(c1[n][0] - c0[n][0], 3),
                        "cpu_share_of_a_core": round((c1[n][0] - c0[n][0]) / wall, 5),
                        "ms_per_tick": round(1e3 * (c1[n][0] - c0[n][0]) / ticks, 3),
                        "ms_per_tick_schedstat": round(1e3 * (c1[n][1] - c0[n][1]) / ticks, 3),
                        "rss_mib_end": round(mem[n].rss / (1 << 20), 2),
                        "uss_mib_end": round(mem[n].uss / (1 << 20), 2),
                        "exposition_lines": lines[n]} for n in ps},
    }, args.json)


if __name__ == "__main__":
    main()
