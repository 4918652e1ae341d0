"""Records real leak traces on a GPU host: gpuwatch's own daemon (real NVML, 1 s ticks) writes a
recording while torch processes warm up, churn transients back to the driver, and leak.

    python3 tests/gpu/record_leak_traces.py OUTDIR [--seconds 500]

Processes (times are seconds after each process's own start):
- `twin`: loads 5 GiB in 512 MiB bursts over ~40 s, then churns 0.5-1.5 GiB transients every
  ~4 s, each returned with empty_cache(). Never leaks.
- `leak3`: the twin's pattern, plus a 62 MiB/s leak from 170 s to 410 s, then holds.
- `leak1`: starts 30 s into the recording; loads 4 GiB, churns, and leaks 50 MiB/s from 70 s
  until the end.
Writes OUTDIR/h200-torch-leaks.jsonl.gz (the recording), OUTDIR/h200-torch-leaks.truth.json (each
process's pid and the wall-clock times of its phases) and the daemon's events log and output.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import json, random, sys, time
    import torch
    MIB = 1 << 20
    name, load_gib, leak_rate, leak_from, leak_until = (
        sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    rng = random.Random(name)
    t0 = time.time()
    def say(what, **kw):
        print(json.dumps({"name": name, "what": what, "t": time.time(), **kw}), flush=True)
    torch.cuda.init()
    say("start")
    weights = []
    for _ in range(int(load_gib * 2)):  # 512 MiB bursts, ~4 s apart: model loading
        weights.append(torch.empty(512 * MIB, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        time.sleep(rng.uniform(2.5, 5.5))
    say("loaded")
    leaked, held, leaking = [], 0, False
    while True:
        now = time.time() - t0
        if leak_rate > 0 and leak_from <= now < leak_until:
            if not leaking:
                say("leak_start"); leaking = True
            while held < leak_rate * MIB * (now - leak_from):
                leaked.append(torch.empty(4 * MIB, dtype=torch.uint8, device="cuda"))
                held += 4 * MIB
        elif leaking and now >= leak_until:
            say("leak_stop", held_mib=held // MIB); leaking = False
        # Transient churn: a 0.5-1.5 GiB working set, returned to the driver.
        if rng.random() < 0.5:
            scratch = torch.empty(int(rng.uniform(512, 1536)) * MIB, dtype=torch.uint8,
                                  device="cuda")
            torch.cuda.synchronize()
            time.sleep(rng.uniform(1.0, 2.5))
            del scratch
            torch.cuda.empty_cache()
        time.sleep(rng.uniform(0.3, 1.5))
""")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--seconds", type=float, default=500)
    args = ap.parse_args()
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "gpuwatch-traces"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    child = work / "child.py"
    child.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "1", "STATE_DIRECTORY": str(work / "state")}
    rec = work / "rec.jsonl"
    log = open(out / "daemon.log", "w")  # noqa: SIM115 - lives as long as the daemon
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "run", "--listen", "127.0.0.1:19431", "--dry-run",
         "--record", str(rec), "--events-log", str(out / "h200-torch-leaks.events.jsonl")],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    t_start = time.time()
    procs: dict[str, subprocess.Popen] = {}

    def spawn(name: str, load: float, rate: float, frm: float, until: float) -> None:
        procs[name] = subprocess.Popen(
            [sys.executable, str(child), name, str(load), str(rate), str(frm), str(until)],
            stdout=subprocess.PIPE, text=True)

    time.sleep(5)
    spawn("twin", 5, 0, 0, 0)
    spawn("leak3", 5, 62, 170, 410)
    late_started = False
    while time.time() - t_start < args.seconds:
        if not late_started and time.time() - t_start >= 30:
            spawn("leak1", 4, 50, 70, 1e9)
            late_started = True
        time.sleep(1)
    for p in procs.values():
        p.terminate()
    truth = {"recording_start": t_start, "processes": {}}
    for name, p in procs.items():
        lines = p.communicate(timeout=30)[0].splitlines()
        truth["processes"][name] = {"pid": p.pid, "phases": [json.loads(x) for x in lines
                                                             if x.startswith("{")]}
    time.sleep(2)
    daemon.terminate()
    daemon.wait(timeout=30)
    with open(rec, "rb") as src, gzip.open(out / "h200-torch-leaks.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (out / "h200-torch-leaks.truth.json").write_text(json.dumps(truth, indent=1))
    print(json.dumps({k: [(ph["what"], round(ph["t"] - t_start, 1)) for ph in v["phases"]]
                      for k, v in truth["processes"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
