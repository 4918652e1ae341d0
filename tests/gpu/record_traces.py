"""Records real GPU memory traces with their truth: gpuwatch's own daemon (real NVML, 1 s ticks)
writes a recording while torch processes follow the patterns of a named scenario set.

    python3 tests/gpu/record_traces.py OUTDIR --set rates [--seconds 540] [--seed 0]

Every process prints its phases (start, loaded, leak_start, leak_stop, step, exit) with the
wall-clock time; the recorder keeps them per pid in NAME.truth.json beside NAME.jsonl.gz.
A process marked `restart` is started again, under a new pid, each time it exits.

Patterns a process can combine (times are seconds after the process's own start):
- `load_gib` in 512 MiB bursts 2.5-5.5 s apart (model weights), or `load_rate` MiB/s for
  `load_seconds` in 4 MiB tensors (a slow, smooth load), or `pool_gib` in four quick chunks
  (a pre-allocated KV pool);
- `leak`: a list of [rate MiB/s, from, until] ramps, paced by the wall clock;
- `step`: [MiB, every, from]: that much kept at each period;
- `churn`: "returned" (0.5-1.5 GiB transients freed with empty_cache), "small" (64-256 MiB
  transients the allocator caches), or "cached" (the returned pattern without empty_cache,
  the caching allocator's sawtooth);
- `ratchet`: max MiB: one working tensor a second, its size drawn from a fixed distribution up
  to max and cached by the allocator, never given back (dynamic shapes): memory grows at each
  new largest size, ever more rarely, and plateaus;
- `ramp_ratchet`: [max MiB, seconds]: four working tensors a step whose size bound grows to
  max over that time and then stays (the `fill` set; it grows about linearly, then plateaus);
- `lifetime`: the process exits after that many seconds.
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
    spec = json.loads(sys.argv[1])
    name = spec["name"]
    rng = random.Random(spec.get("seed", 0) * 7919 + sum(name.encode()) % 1000)
    t0 = time.time()
    def say(what, **kw):
        print(json.dumps({"name": name, "what": what, "t": time.time(), **kw}), flush=True)
    torch.cuda.init()
    torch.empty(1, device="cuda")
    say("start")
    keep = []
    if spec.get("pool_gib"):
        for _ in range(4):
            keep.append(torch.empty(int(spec["pool_gib"] * 256) * MIB, dtype=torch.uint8,
                                    device="cuda"))
            torch.cuda.synchronize()
            time.sleep(rng.uniform(0.5, 1.5))
    for _ in range(int(spec.get("load_gib", 0) * 2)):
        keep.append(torch.empty(512 * MIB, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        time.sleep(rng.uniform(2.5, 5.5))
    if spec.get("load_rate"):
        start, held = time.time(), 0
        while time.time() - start < spec["load_seconds"]:
            while held < spec["load_rate"] * MIB * (time.time() - start):
                keep.append(torch.empty(4 * MIB, dtype=torch.uint8, device="cuda"))
                held += 4 * MIB
            time.sleep(0.05)
    say("loaded")
    leaks = spec.get("leak", [])
    leaked = [0] * len(leaks)
    active = [False] * len(leaks)
    step = spec.get("step")
    steps_done = 0
    ratchet = spec.get("ratchet")
    while True:
        now = time.time() - t0
        if spec.get("lifetime") and now >= spec["lifetime"]:
            say("exit")
            break
        for i, (rate, frm, until) in enumerate(leaks):
            if frm <= now < until:
                if not active[i]:
                    say("leak_start", rate=rate); active[i] = True
                while leaked[i] < rate * MIB * (now - frm):
                    keep.append(torch.empty(4 * MIB, dtype=torch.uint8, device="cuda"))
                    leaked[i] += 4 * MIB
            elif active[i] and now >= until:
                say("leak_stop", held_mib=leaked[i] // MIB); active[i] = False
        if step and now >= step[2] + steps_done * step[1]:
            keep.append(torch.empty(int(step[0]) * MIB, dtype=torch.uint8, device="cuda"))
            steps_done += 1
            say("step", mib=step[0], n=steps_done)
        if ratchet:
            work = torch.empty(int(ratchet * rng.random() ** 2) * MIB + MIB, dtype=torch.uint8,
                               device="cuda")
            torch.cuda.synchronize()
            work = None
        ramp = spec.get("ramp_ratchet")
        if ramp:
            bound = ramp[0] * min(1.0, max(0.1, now / ramp[1]))
            work = [torch.empty(int(rng.uniform(0.2, 1.0) * bound / 4) * MIB, dtype=torch.uint8,
                                device="cuda") for _ in range(4)]
            torch.cuda.synchronize()
            work = []
        churn = spec.get("churn")
        if churn in ("returned", "cached") and rng.random() < 0.5:
            scratch = torch.empty(int(rng.uniform(512, 1536)) * MIB, dtype=torch.uint8,
                                  device="cuda")
            torch.cuda.synchronize()
            time.sleep(rng.uniform(1.0, 2.5))
            del scratch
            if churn == "returned":
                torch.cuda.empty_cache()
        elif churn == "small":
            scratch = torch.empty(int(rng.uniform(64, 256)) * MIB, dtype=torch.uint8,
                                  device="cuda")
            torch.cuda.synchronize()
            del scratch
        time.sleep(rng.uniform(0.3, 1.5))
""")

# Each set: (start offset in the recording, spec). Rates in MiB/s.
SETS: dict[str, list[tuple[float, dict]]] = {
    # Leaks across rates and onsets, under the no-leak patterns that look most like them; about
    # 95 GiB at the end, clear of the wall. Recorded after the detector was written: held out.
    "rates": [
        (3, {"name": "pool", "pool_gib": 20, "churn": "small"}),
        (3, {"name": "twin", "load_gib": 5, "churn": "returned"}),
        (5, {"name": "leak2", "load_gib": 2, "churn": "returned", "leak": [[2, 60, 1e9]]}),
        (10, {"name": "leak5", "churn": "small", "leak": [[5, 0, 1e9]]}),
        (20, {"name": "leak20", "load_gib": 3, "churn": "returned", "leak": [[20, 15, 1e9]]}),
        (30, {"name": "leak40", "load_gib": 3, "churn": "returned", "leak": [[40, 90, 330]]}),
        (40, {"name": "slowload", "load_rate": 100, "load_seconds": 180, "churn": "returned"}),
        (15, {"name": "ratchet", "ratchet": 3072}),
        (8, {"name": "restart", "load_gib": 3, "churn": "returned", "lifetime": 60,
             "restart": True}),
        (25, {"name": "step", "load_gib": 2, "churn": "returned", "step": [256, 60, 60]}),
    ],
    # Other rates and onsets than `rates`, for a detector judged on traces it was not built
    # on: a leak with its process, one that stops, one late in a quiet process, a stepwise
    # leak, under the allocator's sawtooth; a slow smooth load and a ratchet that are not.
    "onsets": [
        (3, {"name": "pool", "pool_gib": 16, "churn": "cached"}),
        (4, {"name": "leak10", "churn": "cached", "leak": [[10, 0, 1e9]]}),
        (6, {"name": "leak80", "load_gib": 3, "churn": "returned", "leak": [[80, 45, 165]]}),
        (8, {"name": "leak30", "load_gib": 2, "churn": "small", "leak": [[30, 150, 1e9]]}),
        (10, {"name": "slowload", "load_rate": 50, "load_seconds": 200, "churn": "small"}),
        (12, {"name": "ratchet", "ratchet": 2048}),
        (14, {"name": "restart", "load_gib": 2, "churn": "returned", "lifetime": 80,
              "restart": True}),
        (16, {"name": "step", "load_gib": 1, "churn": "cached", "step": [512, 45, 30]}),
    ],
    # The first take of `rates`: a ratchet that grew about linearly to 50 GiB with a 30 GiB pool
    # beside it, so the GPU filled up and processes died of real OOMs from about 230 s.
    "fill": [
        (3, {"name": "pool", "pool_gib": 30, "churn": "small"}),
        (3, {"name": "twin", "load_gib": 5, "churn": "returned"}),
        (5, {"name": "leak2", "load_gib": 2, "churn": "returned", "leak": [[2, 60, 1e9]]}),
        (10, {"name": "leak5", "churn": "small", "leak": [[5, 0, 1e9]]}),
        (20, {"name": "leak20", "load_gib": 3, "churn": "returned", "leak": [[20, 15, 1e9]]}),
        (30, {"name": "leak40", "load_gib": 3, "churn": "returned",
              "leak": [[40, 120, 420]]}),
        (60, {"name": "slowload", "load_rate": 100, "load_seconds": 180, "churn": "returned"}),
        (15, {"name": "ratchet", "ramp_ratchet": [6144, 200]}),
        (8, {"name": "restart", "load_gib": 3, "churn": "returned", "lifetime": 60,
             "restart": True}),
        (25, {"name": "step", "load_gib": 2, "churn": "returned", "step": [256, 60, 60]}),
    ],
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--set", choices=sorted(SETS), required=True)
    ap.add_argument("--seconds", type=float, default=540)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=19431)
    args = ap.parse_args()
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"h200-{args.set}"
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuwatch-traces-{args.set}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    child = work / "child.py"
    child.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "1", "STATE_DIRECTORY": str(work / "state")}
    rec = work / "rec.jsonl"
    log = open(out / f"{stem}.daemon.log", "w")  # noqa: SIM115 - lives as long as the daemon
    daemon = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "run", "--listen", f"127.0.0.1:{args.port}",
         "--dry-run", "--record", str(rec), "--events-log", str(out / f"{stem}.events.jsonl")],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    t_start = time.time()
    pending = sorted(SETS[args.set], key=lambda x: x[0])
    running: list[tuple[dict, subprocess.Popen]] = []
    done: list[tuple[dict, subprocess.Popen, list[str]]] = []

    def spawn(spec: dict) -> None:
        spec = {**spec, "seed": args.seed}
        running.append((spec, subprocess.Popen(
            [sys.executable, str(child), json.dumps(spec)], stdout=subprocess.PIPE, text=True)))

    while time.time() - t_start < args.seconds:
        now = time.time() - t_start
        while pending and pending[0][0] <= now:
            spawn(pending.pop(0)[1])
        for item in list(running):
            spec, p = item
            if p.poll() is not None:
                running.remove(item)
                done.append((spec, p, p.stdout.read().splitlines()))
                if spec.get("restart"):
                    spawn(spec)
        time.sleep(0.5)
    for _, p in running:
        p.terminate()
    for spec, p in running:
        done.append((spec, p, p.communicate(timeout=30)[0].splitlines()))
    time.sleep(2)
    daemon.terminate()
    daemon.wait(timeout=30)
    truth: dict = {"recording_start": t_start, "set": args.set, "seed": args.seed,
                   "specs": {s["name"]: s for _, s in SETS[args.set]}, "processes": []}
    for spec, p, lines in done:
        truth["processes"].append({"name": spec["name"], "pid": p.pid, "phases": [
            json.loads(x) for x in lines if x.startswith("{")]})
    with open(rec, "rb") as src, gzip.open(out / f"{stem}.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (out / f"{stem}.truth.json").write_text(json.dumps(truth, indent=1))
    for proc in truth["processes"]:
        print(proc["name"], proc["pid"],
              [(ph["what"], round(ph["t"] - t_start, 1)) for ph in proc["phases"]
               if ph["what"] != "step"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
