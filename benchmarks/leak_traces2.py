"""A second, independently written family of leak traces (held out from the detector's
tuning, which used benchmarks/leak_detection.py's generator).

What differs from the first family:
- **noise**: heavy-tailed (Laplace) and quantised to the caching allocator's 2 MiB pages,
  with rare one-sample spikes; sampling jitter (±15 % of the interval) and dropped ticks;
- **workloads**: a vLLM-like pool at 90 % of the GPU that sleeps (frees its pool) and wakes
  (takes it back in a few seconds) every 20-40 min; a training loop (allocator segments
  that come and go, a checkpoint copy every 10 min that holds 1-3 GiB for 30-90 s); a server whose
  transients are returned to the driver every few seconds (empty_cache churn);
- **leaks**: 12 MiB/min and 50 MiB/s starting under churn, a 50 MiB/s leak in a process's
  second minute (before it is steady), a slow leak in a training loop, a leak that stops.

    python -m benchmarks.leak_traces2 [--seeds 10] [--json OUT]
    python -m benchmarks.leak_traces2 --recording RECORDING TRUTH   # a real trace
        (tests/fixtures/traces/h200/h200-torch-leaks.{jsonl.gz,truth.json})

Scores, per trace: false alarms (firing episodes on a series that does not leak, or before
its leak starts, the GPU's own series included), firing episodes on the leaking pid while it
leaks (one is the goal), and latency from onset to the first alarm of the goal's severity.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import dataclass, field

from benchmarks.leak_detection import fmt_latency
from gpuwatch.config import Config
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.pipeline import Pipeline

MIB = 1 << 20
GIB = 1 << 30
T0 = 1_780_000_000.0
H100 = ("NVIDIA H100 80GB HBM3", 81559 * MIB)
PAGE = 2 * MIB


@dataclass
class Leak:
    pid: int
    onset: float  # seconds into the trace
    rate: float  # bytes/s
    stop: float = math.inf
    severity: str = "warning"
    goal_seconds: float = 1800.0

    def bytes_at(self, t: float) -> float:
        return 0.0 if t < self.onset else self.rate * (min(t, self.stop) - self.onset)


@dataclass
class Proc:
    pid: int
    shape: object  # shape(t_since_start, rng) -> bytes
    start: float = 0.0  # seconds into the trace; < 0: already running
    leak: Leak | None = None


@dataclass
class Trace:
    name: str
    procs: list[Proc]
    hours: float = 2.0
    interval: float = 2.0
    leak: Leak | None = field(default=None)


def _noise(rng: random.Random, scale: float) -> float:
    """Laplace noise with a rare spike (a sample taken mid-allocation)."""
    if rng.random() < 0.002:
        return rng.choice((-1, 1)) * rng.uniform(200, 600) * MIB
    return rng.expovariate(1 / scale) * rng.choice((-1, 1))


def _loaded(age: float, weights: float, load_s: float, burst: float) -> float:
    """Weights arriving in bursts of `burst` bytes over load_s."""
    if age >= load_s:
        return weights
    n = max(1, int(weights // burst))
    return weights * math.ceil(age / load_s * n) / n


def vllm_pool(rng: random.Random, total: int, cycle: tuple[float, float]):
    """Pool at 90 % of the GPU; sleeps (1 GiB left) for 2-5 min every `cycle` seconds."""
    pool = 0.9 * total
    period = rng.uniform(*cycle)
    nap = rng.uniform(120, 300)
    phase = rng.uniform(0, period)

    def shape(age: float, r: random.Random) -> float:
        if age < 90:
            return _loaded(age, pool, 90, 2 * GIB)
        if (age + phase) % period < nap:
            return 1 * GIB
        return pool
    return shape


def trainer(rng: random.Random, weights: float, every: float = 600.0):
    """Weights + optimizer state + activations; freed activations stay in the caching
    allocator (NVML sees their peak, not each step), whose segments still come and go by
    tens of MiB; a checkpoint every 10 min clones the state on the GPU (1-3 GiB for
    30-90 s) and gives it back with empty_cache()."""
    act = rng.uniform(2, 8) * GIB
    ckpt = rng.uniform(1, 3) * GIB
    ckpt_s = rng.uniform(30, 90)
    segs = [rng.choice((0, 20, 20, 40, 160)) * MIB for _ in range(97)]

    def shape(age: float, r: random.Random) -> float:
        if age < 120:
            return _loaded(age, weights, 120, 1 * GIB)
        v = weights + act + segs[int(age // 7) % 97]
        if (age % every) < ckpt_s and age > every:
            v += ckpt
        return v
    return shape


def churner(rng: random.Random, weights: float, load_s: float = 40.0):
    """A server that loads in 512 MiB bursts, then churns 0.5-1.5 GiB transients it gives
    back with empty_cache() every few seconds."""
    period = rng.uniform(3, 6)
    amps = [rng.uniform(0.5, 1.5) * GIB for _ in range(64)]

    def shape(age: float, r: random.Random) -> float:
        if age < load_s:
            return _loaded(age, weights, load_s, 512 * MIB)
        k = int(age // period)
        return weights + (amps[k % 64] if (age % period) < period / 2 else 0.0)
    return shape


def traces(seed: int) -> list[Trace]:
    rng = random.Random(1000 + seed)
    total = H100[1]
    out = [
        Trace("vllm_sleep_wake", [Proc(2001, vllm_pool(rng, total, (1200, 2400)), -3600)]),
        Trace("training_checkpoints", [Proc(2002, trainer(rng, 30 * GIB), -60)]),
        Trace("churn", [Proc(2003, churner(rng, 20 * GIB), 0.0)]),
        Trace("new_process_next_to_training", [
            Proc(2004, trainer(rng, 24 * GIB), -3600),
            Proc(2005, churner(rng, 6 * GIB), 1800.0),
        ]),
    ]
    onset = 1800 + rng.uniform(0, 900)
    lk = Leak(2101, onset, 12 * MIB / 60)
    out.append(Trace("leak_12mib_min_under_churn",
                     [Proc(2101, churner(rng, 16 * GIB), -60, lk)], leak=lk))
    lk = Leak(2102, onset, 50 * MIB, stop=onset + 240, severity="critical", goal_seconds=60)
    out.append(Trace("leak_50mib_s_under_churn",
                     [Proc(2102, churner(rng, 16 * GIB), -60, lk)], hours=1.0, leak=lk))
    start = 600.0
    lk = Leak(2103, start + rng.uniform(60, 120), 50 * MIB, stop=start + 420,
              severity="critical", goal_seconds=60)
    out.append(Trace("leak_50mib_s_in_second_minute",
                     [Proc(2103, churner(rng, 12 * GIB), start, lk)], hours=1.0, leak=lk))
    lk = Leak(2104, onset, 20 * MIB / 60)
    out.append(Trace("slow_leak_in_training_loop",
                     [Proc(2104, trainer(rng, 20 * GIB), -3600, lk)], leak=lk))
    lk = Leak(2105, onset, 12 * MIB / 60)
    out.append(Trace("leak_next_to_sleeping_vllm", [
        Proc(2105, churner(rng, 6 * GIB), -60, lk),
        Proc(2106, vllm_pool(rng, int(0.7 * total), (1200, 1800)), -3600),
    ], leak=lk))
    return out


def ticks(trace: Trace, seed: int):
    rng = random.Random(seed * 104729 + sum(map(ord, trace.name)))
    name, total = H100
    t, end = 0.0, trace.hours * 3600
    while t < end:
        procs = []
        for p in trace.procs:
            if t < p.start:
                continue
            age = t - p.start
            v = p.shape(age, rng) + (p.leak.bytes_at(t) if p.leak else 0.0)
            v = max(0.0, v + _noise(rng, 4 * MIB))
            procs.append(ProcessSample(pid=p.pid, name="python3", create_time=T0 + p.start,
                                       used_memory_bytes=int(v // PAGE * PAGE)))
        if rng.random() > 0.01:  # a dropped tick now and then
            used = min(total, sum(p.used_memory_bytes for p in procs) + 700 * MIB)
            yield Tick(t=round(T0 + t, 3), gpus=[GpuSample(
                index=0, uuid="GPU-held-out-0", name=name, memory_total_bytes=total,
                memory_used_bytes=int(used), processes=procs)])
        t += trace.interval * rng.uniform(0.85, 1.15)


def run(trace: Trace, seed: int = 0) -> list[tuple[int | None, float, str, str]]:
    """(pid, seconds into the trace, state, severity) of every memory_leak event."""
    pipeline = Pipeline(Config(), None, strict=True)
    out = []
    for tick in ticks(trace, seed):
        for ev in pipeline.update(tick):
            if ev.signal == "memory_leak":
                out.append((ev.pid, ev.t - T0, ev.state, ev.severity))
    return out


def score(trace: Trace, events) -> dict:
    leak = trace.leak
    false_alarms = 0
    latency = None
    for pid, t, state, severity in events:
        if state != "firing":
            continue
        if leak is None or pid != leak.pid or t < leak.onset:
            false_alarms += 1
        elif latency is None and (leak.severity != "critical" or severity == "critical"):
            latency = t - leak.onset
    return {"false_alarms": false_alarms, "latency": latency,
            "episodes_while_leaking": _episodes(events, leak) if leak is not None else 0}


def _episodes(events, leak: Leak) -> int:
    """Firing episodes of the leaking pid that start while it leaks (an escalation within
    an episode is not a new one)."""
    n, open_ = 0, False
    for pid, t, state, _ in events:
        if pid != leak.pid:
            continue
        if state == "resolved":
            open_ = False
        elif not open_:
            open_ = True
            if leak.onset <= t <= leak.stop:
                n += 1
    return n


def recorded(path: str, truth_path: str) -> dict:
    """Replay a real recording and score it against its truth file (pid and phase times
    per process): per process, its memory_leak events and, for a leak, the latency from
    its leak_start to the first critical event."""
    from gpuwatch.recording import read_recording
    from gpuwatch.thresholds import load_table

    with open(truth_path) as f:
        truth = json.load(f)
    _, ticks = read_recording(path)
    pipeline = Pipeline(Config(), load_table(), strict=True)
    events = [e for tick in ticks for e in pipeline.update(tick) if e.signal == "memory_leak"]
    out: dict = {"gpu_series_events": [e for e in events if e.pid is None]}
    for name, proc in truth["processes"].items():
        mine = [e for e in events if e.pid == proc["pid"]]
        onset = next((p["t"] for p in proc["phases"] if p["what"] == "leak_start"), None)
        crit = next((e.t for e in mine if e.severity == "critical"), None)
        out[name] = {"events": mine, "onset": onset,
                     "latency": None if onset is None or crit is None else crit - onset}
    return out


def evaluate(seeds: int) -> list[dict]:
    rows: dict[str, dict] = {}
    for seed in range(seeds):
        for trace in traces(seed):
            r = score(trace, run(trace, seed))
            row = rows.setdefault(trace.name, {"trace": trace.name, "runs": 0,
                                               "false_alarms": 0, "max_episodes": 0,
                                               "latencies": [], "leaking": bool(trace.leak),
                                               "goal": trace.leak.goal_seconds if trace.leak
                                               else None})
            row["runs"] += 1
            row["false_alarms"] += r["false_alarms"]
            row["max_episodes"] = max(row["max_episodes"], r["episodes_while_leaking"])
            if r["latency"] is not None:
                row["latencies"].append(r["latency"])
    return list(rows.values())


def print_table(rows: list[dict], out=sys.stdout) -> None:
    out.write("| trace | false alarms | detected | episodes per leak (max) | latency median | "
              "latency max | goal |\n|---|---|---|---|---|---|---|\n")
    for r in rows:
        lat = r["latencies"]
        det = f"{len(lat)}/{r['runs']}" if r["leaking"] else "n/a"
        out.write(f"| {r['trace']} | {r['false_alarms']} | {det} | "
                  f"{r['max_episodes'] if r['leaking'] else '-'} | "
                  f"{fmt_latency(statistics.median(lat) if lat else None)} | "
                  f"{fmt_latency(max(lat) if lat else None)} | {fmt_latency(r['goal'])} |\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--recording", nargs=2, metavar=("RECORDING", "TRUTH"),
                    help="score a real recording against its truth file instead")
    args = ap.parse_args(argv)
    if args.recording:
        for name, r in recorded(*args.recording).items():
            if name == "gpu_series_events":
                print(f"GPU's own series: {len(r)} events")
                continue
            states = ", ".join(f"{e.state} {e.severity}" for e in r["events"]) or "no event"
            print(f"{name}: {states}; latency {fmt_latency(r['latency'])}")
        return
    rows = evaluate(args.seeds)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
