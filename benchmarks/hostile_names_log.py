"""Log bytes per minute, and what scrapers get, while a process of another user whose name
is not valid UTF-8 (and carries terminal controls) is on the GPU.

    python -m benchmarks.hostile_names_log [--anchor TREE] [--seconds 60] [--every 1]
        [--no-record] [-o FILE]

Runs as root. A real daemon (`--record` on unless --no-record) over a fake GPU that lists
two real processes of uid 4242: one renamed through prctl(PR_SET_NAME) to bytes ff fe 1b ...,
one running a binary whose file name is such bytes. A scraper gets /metrics, /api/state, /
and /readyz every `--every` seconds. The processes appear on the GPU 5 s after the daemon
started (its first ticks are clean, as on a host where the user comes later); measured from
then on: log bytes and lines per minute, the status codes each endpoint answered, how many
/metrics answers had GPU series at all and how old the sample they show is at the end, the
ticks recorded with the processes in them.

`--anchor TREE` runs the same first on another checkout of gpuwatch (for instance a
worktree of the commit before the fix), side by side in one run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import emit
from tests import hostile_users as hu
from tests.helpers import REPO, free_port, http_get, wait_until

ENDPOINTS = ("/metrics", "/api/state", "/", "/readyz")
WARMUP_SECONDS = 5.0


def phase(tree: Path, seconds: float, every: float, record: bool) -> dict:
    procs = hu.Procs()
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-bench-names-"))
    try:
        renamed = procs.renamed(hu.BAD_COMM, hu.ATTACKER)
        binary = procs.binary_named(hu.BAD_FILE, hu.ATTACKER)
        (work / "pids").write_text("")
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(tree), "FAKE_NVML_PIDS_FILE": str(work / "pids"),
               "STATE_DIRECTORY": str(work / "state"), "GPUWATCH_PROBE_DIR": str(work / "probe")}
        log = work / "daemon.log"
        with open(log, "wb") as out:
            daemon = subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "fake_nvml_daemon.py"), "run",
                 "--listen", f"127.0.0.1:{port}",
                 *(["--record", str(work / "rec.jsonl")] if record else [])],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: http_get(url + "/healthz", 1.0)[0] == 200, 30,
                       what="the daemon serving")
            time.sleep(WARMUP_SECONDS)
            size0, lines0 = log.stat().st_size, len(log.read_bytes().splitlines())
            (work / "pids").write_text(f"{renamed.pid}\n{binary.pid}\n")
            codes: dict[str, collections.Counter] = {e: collections.Counter() for e in ENDPOINTS}
            with_gpu = 0
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                for e in ENDPOINTS:
                    code, body = http_get(url + e, 10.0)
                    codes[e][code] += 1
                    with_gpu += e == "/metrics" and b"gpuwatch_gpu_memory_used_bytes{" in body
                time.sleep(max(0.0, every - (time.monotonic() - t0) % every))
            elapsed = time.monotonic() - t0
            data = log.read_bytes()
            code, body = http_get(url + "/api/state", 10.0)
            state_t = json.loads(body).get("t") if code == 200 else None
        finally:
            daemon.terminate()
            daemon.wait(30)
        minutes = elapsed / 60
        grown = len(data) - size0
        # ticks recorded with the named processes in them
        rec = (work / "rec.jsonl").read_bytes() if (work / "rec.jsonl").exists() else b""
        ticks = sum(f'"pid":{renamed.pid}'.encode() in line for line in rec.splitlines())
        return {
            "tree": str(tree), "seconds": round(elapsed, 1),
            "log_bytes_per_minute": round(grown / minutes),
            "log_lines_per_minute": round((len(data.splitlines()) - lines0) / minutes, 1),
            "log_mb_per_day": round(grown / minutes * 1440 / 1e6, 1),
            "tracebacks": data.count(b"Traceback"),
            "status_codes": {e: dict(c) for e, c in codes.items()},
            "metrics_with_gpu_series": with_gpu,
            # how old the sample /api/state (and /metrics) shows is at the end
            "sample_age_seconds": round(time.time() - state_t, 1) if state_t else None,
            "ticks_recorded": ticks,
        }
    finally:
        procs.close()
        hu.remove_shared(str(work))  # and the probe filesystem the daemon made for the user


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--anchor", help="another gpuwatch checkout to run first")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--no-record", dest="record", action="store_false")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: the named processes run as another uid")
    runs = {}
    if args.anchor:
        runs["anchor"] = phase(Path(args.anchor).resolve(), args.seconds, args.every,
                               args.record)
    runs["this"] = phase(REPO, args.seconds, args.every, args.record)
    emit({"machine": f"{platform.machine()} {os.cpu_count()} cpus python "
                     f"{platform.python_version()}",
          "scrape_every_seconds": args.every, "record": args.record, "endpoints": ENDPOINTS,
          **runs}, args.output)


if __name__ == "__main__":
    main()
