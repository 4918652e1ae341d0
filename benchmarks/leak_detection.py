"""Leak detection quality: gpuwatch's detector against least squares over raw samples.

The baseline is what PromQL's deriv() computes — an ordinary least-squares slope over the
raw samples of a window — alerting when it reaches the same thresholds (12 MiB/min warning,
50 MiB/s critical). Both see the same synthetic traces, generated here from a seed:
serving processes with allocator sawtooth, warm-up growth that plateaus, transients of
hundreds of MB that last minutes, restarts and reloads; and leaks of 12 MiB/min, 128 MiB
steps every 10 min and 50 MiB/s, one of them in a process next to one that does not leak.

    python -m benchmarks.leak_detection [--seeds 10] [--hours 4] [--json OUT]
    python -m benchmarks.leak_detection --replay-speed   # analyzers over 24 h at 5 s

Reports, per scenario and detector: false alarms (firing episodes on series that do not
leak, or before the leak starts), detections on the right pid, and detection latency
(onset to the first alarm of the expected severity).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
import zlib
from collections import deque
from dataclasses import dataclass, field

from gpuwatch.config import Config
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.config import LeakConfig
from gpuwatch.signals.pipeline import Pipeline

MIB = 1 << 20
GIB = 1 << 30
T0 = 1_767_225_600.0  # trace epoch (any fixed value: everything is relative)
A100 = ("NVIDIA A100-SXM4-80GB", 80 * GIB)
WARN = 12 * MIB / 60  # bytes/s
CRIT = 50 * MIB
GPU = -1  # the GPU's own series, scored next to the pids
TOLERANCE = LeakConfig().tolerance


# -- synthetic processes --------------------------------------------------------------------


@dataclass
class Leak:
    onset: float  # seconds into the trace
    kind: str  # linear | steps
    rate: float = 0.0  # bytes/s for linear
    step_bytes: float = 0.0
    step_every: float = 0.0
    stop: float = math.inf  # the leak stops growing here

    def bytes_at(self, t: float) -> float:
        if t < self.onset:
            return 0.0
        dt = min(t, self.stop) - self.onset
        if self.kind == "linear":
            return self.rate * dt
        return self.step_bytes * (1 + math.floor(dt / self.step_every))

    @property
    def expected(self) -> str:
        return "critical" if self.kind == "linear" and self.rate >= CRIT else "warning"


@dataclass
class Life:
    """One process lifetime: load, warm-up towards a plateau, then serving."""

    pid: int
    start: float
    end: float = math.inf
    weights: float = 16 * GIB
    load_seconds: float = 60.0
    warm_bytes: float = 3 * GIB  # approached exponentially after loading
    warm_tau: float = 120.0
    warm_peak: float = 1.5 * GIB  # a CUDA-graph-capture peak that comes back down
    saw_amp: float = 600 * MIB
    saw_period: float = 60.0
    saw_phase: float = 0.0
    noise: float = 8 * MIB
    transients: list[tuple[float, float, float]] = field(default_factory=list)
    leak: Leak | None = None
    reload_at: float | None = None  # same pid: memory released and loaded again

    def value(self, t: float, rng: random.Random) -> float | None:
        if not self.start <= t < self.end:
            return None
        age = t - self.start
        if self.reload_at is not None and t >= self.reload_at:
            age = t - self.reload_at
            if age < 20:
                return 300 * MIB + rng.gauss(0, self.noise)
            age -= 20
        v = self.weights * min(1.0, age / self.load_seconds)
        if age > self.load_seconds:
            a = age - self.load_seconds
            v += self.warm_bytes * (1 - math.exp(-a / self.warm_tau))
            if a < 90:
                v += self.warm_peak * math.sin(math.pi * a / 90) ** 2
            v += self.saw_amp * (((t + self.saw_phase) % self.saw_period) / self.saw_period)
        for start, dur, amp in self.transients:
            if start <= t < start + dur:
                v += amp
        if self.leak is not None:
            v += self.leak.bytes_at(t)
        return max(0.0, v + rng.gauss(0, self.noise))


@dataclass
class Scenario:
    name: str
    lives: list[Life]
    leaking: bool
    # False: the driver gives no per-process figures (some MIG and container set-ups);
    # only the GPU's used memory can be judged, and latency is the GPU series'.
    attributed: bool = True

    def truth(self) -> dict[int, Leak]:
        """The leak of each leaking pid, and of the GPU (its earliest, worst leak)."""
        out = {life.pid: life.leak for life in self.lives if life.leak is not None}
        if out:
            out[GPU] = min(out.values(), key=lambda lk: (lk.onset, lk.expected != "critical"))
        return out


def _transients(rng: random.Random, hours: float, per_hour: float) -> list[tuple]:
    out, t = [], 600.0
    while True:
        t += rng.expovariate(per_hour / 3600)
        if t > hours * 3600:
            return out
        out.append((t, rng.uniform(60, 600), rng.uniform(200, 800) * MIB))


def _serving(rng: random.Random, pid: int, **kw) -> Life:
    """A serving process with a randomly drawn sawtooth and warm-up."""
    base = {
        "pid": pid, "start": 0.0,
        "weights": rng.uniform(8, 30) * GIB,
        "load_seconds": rng.uniform(20, 180),
        "warm_bytes": rng.uniform(0.5, 4) * GIB,
        "warm_tau": rng.uniform(30, 240),
        "warm_peak": rng.uniform(0, 2) * GIB,
        "saw_amp": rng.uniform(100, 1200) * MIB,
        "saw_period": rng.uniform(10, 300),
        "saw_phase": rng.uniform(0, 300),
        "noise": rng.uniform(2, 20) * MIB,
    }
    base.update(kw)
    return Life(**base)


def scenarios(seed: int, hours: float) -> list[Scenario]:
    rng = random.Random(seed)
    end = hours * 3600
    onset = 3600.0 + rng.uniform(0, 600)
    tr = _transients
    out = [
        Scenario("sawtooth", [_serving(rng, 1001)], False),
        Scenario("plateau", [_serving(rng, 1002, warm_bytes=rng.uniform(3, 6) * GIB,
                                      warm_tau=rng.uniform(180, 300))], False),
        Scenario("transients", [_serving(rng, 1003, transients=tr(rng, hours, 3))], False),
        Scenario("restart", [
            _serving(rng, 1004, end=end / 2),
            _serving(rng, 1005, start=end / 2 + 30),
        ], False),
        Scenario("reload", [_serving(rng, 1006, reload_at=end / 2)], False),
        Scenario("vllm_flat", [Life(pid=1007, start=0, weights=72 * GIB, load_seconds=90,
                                    warm_bytes=0, warm_peak=0, saw_amp=0, noise=1 * MIB)],
                 False),
        Scenario("leak_12mib_min", [_serving(rng, 1101, leak=Leak(onset, "linear", WARN))],
                 True),
        Scenario("leak_128mib_steps", [_serving(
            rng, 1102, leak=Leak(onset, "steps", step_bytes=128 * MIB, step_every=600))], True),
        Scenario("leak_50mib_s", [_serving(
            rng, 1103, weights=rng.uniform(8, 20) * GIB,
            leak=Leak(onset, "linear", CRIT, stop=onset + 180))], True),
        Scenario("two_procs", [
            _serving(rng, 1104, leak=Leak(onset, "linear", WARN)),
            _serving(rng, 1105, transients=tr(rng, hours, 3)),
        ], True),
        Scenario("leak_with_transients", [_serving(
            rng, 1106, transients=tr(rng, hours, 3), leak=Leak(onset, "linear", WARN))], True),
        Scenario("gpu_only_busy", [
            _serving(rng, 1201, transients=tr(rng, hours, 2)),
            _serving(rng, 1202, transients=tr(rng, hours, 2)),
        ], False, attributed=False),
        Scenario("gpu_only_leak", [
            _serving(rng, 1203, leak=Leak(onset, "linear", WARN)),
            _serving(rng, 1204),
        ], True, attributed=False),
    ]
    return out


def ticks(sc: Scenario, seed: int, hours: float, interval: float):
    """(t, {pid: bytes}) per sample, and the GPU ticks built from them."""
    rng = random.Random(seed * 7919 + zlib.crc32(sc.name.encode()))
    n = int(hours * 3600 / interval)
    name, total = A100
    for i in range(n):
        t = i * interval
        procs = []
        for life in sc.lives:
            v = life.value(t, rng)
            if v is not None:
                procs.append((life, v))
        used = min(total, int(sum(v for _, v in procs)) + 600 * MIB)
        procs = [ProcessSample(pid=life.pid, name="python3", create_time=T0 + life.start,
                               used_memory_bytes=int(v) if sc.attributed else None)
                 for life, v in procs]
        yield Tick(t=T0 + t, gpus=[GpuSample(
            index=0, uuid="GPU-bench-0", name=name, memory_total_bytes=total,
            memory_used_bytes=used, processes=procs)])


# -- detectors ------------------------------------------------------------------------------


class OlsWindow:
    """deriv(): least-squares slope over the raw samples of the last `window` seconds."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.s: deque[tuple[float, float]] = deque()
        self.n = self.st = self.sv = self.stt = self.stv = 0.0

    def add(self, t: float, v: float) -> float | None:
        t -= T0
        v /= MIB  # keep the sums small
        self.s.append((t, v))
        self._acc(t, v, 1)
        while t - self.s[0][0] > self.window:
            self._acc(*self.s.popleft(), -1)
        if self.n < 2:
            return None
        den = self.n * self.stt - self.st * self.st
        if den <= 0:
            return None
        return (self.n * self.stv - self.st * self.sv) / den * MIB

    def _acc(self, t: float, v: float, sign: int) -> None:
        self.n += sign
        self.st += sign * t
        self.sv += sign * v
        self.stt += sign * t * t
        self.stv += sign * t * v


@dataclass
class Alarms:
    """Firing episodes per pid: [(start, end, severity)]."""

    episodes: dict[int, list[list]] = field(default_factory=dict)

    def set(self, pid: int, t: float, severity: str | None) -> None:
        eps = self.episodes.setdefault(pid, [])
        open_ = eps and eps[-1][1] is None
        if severity is None:
            if open_:
                eps[-1][1] = t
        elif not open_:
            eps.append([t, None, severity])
        elif severity == "critical":
            eps[-1][2] = "critical"


def run_gpuwatch(sc: Scenario, seed: int, hours: float, interval: float,
                 config: Config | None = None) -> Alarms:
    pipeline = Pipeline(config or Config(), None, strict=True)
    alarms = Alarms()
    for tick in ticks(sc, seed, hours, interval):
        for ev in pipeline.update(tick):
            if ev.signal != "memory_leak":
                continue
            pid = GPU if ev.pid is None else ev.pid
            alarms.set(pid, ev.t - T0, ev.severity if ev.state == "firing" else None)
    return alarms


def run_ols(sc: Scenario, seed: int, hours: float, interval: float, warn_window: float,
            crit_window: float, hold: float = 0.0) -> Alarms:
    """deriv(x[warn_window]) >= 12 MiB/min, deriv(x[crit_window]) >= 50 MiB/s (less the
    same tolerance gpuwatch allows itself), held for `hold` seconds (Prometheus' `for:`)
    before it fires."""
    alarms = Alarms()
    state: dict[int, tuple[OlsWindow, OlsWindow, dict]] = {}
    for tick in ticks(sc, seed, hours, interval):
        t = tick.t - T0
        gpu = tick.gpus[0]
        series = [(p.pid, p.used_memory_bytes) for p in gpu.processes
                  if p.used_memory_bytes is not None]
        for pid, value in [*series, (GPU, gpu.memory_used_bytes)]:
            w, c, pend = state.setdefault(
                pid, (OlsWindow(warn_window), OlsWindow(crit_window), {}))
            sw, sc_ = w.add(tick.t, value), c.add(tick.t, value)
            sev = None
            if sc_ is not None and sc_ >= CRIT * (1 - TOLERANCE):
                sev = "critical"
            elif sw is not None and sw >= WARN * (1 - TOLERANCE):
                sev = "warning"
            if sev is None:
                pend.clear()
            else:
                pend.setdefault("since", t)
            if sev is not None and t - pend["since"] < hold:
                sev = None
            alarms.set(pid, t, sev)
    return alarms


DETECTORS = {
    "gpuwatch": run_gpuwatch,
    "deriv 10m": lambda sc, s, h, i: run_ols(sc, s, h, i, 600, 120),
    "deriv 24m": lambda sc, s, h, i: run_ols(sc, s, h, i, 1440, 120),
    "deriv 24m for 5m": lambda sc, s, h, i: run_ols(sc, s, h, i, 1440, 120, hold=300),
    "deriv 60m": lambda sc, s, h, i: run_ols(sc, s, h, i, 3600, 120),
}


# -- scoring --------------------------------------------------------------------------------


def score(sc: Scenario, alarms: Alarms) -> dict:
    """False alarms count on every series, the GPU's included; latency is the leaking
    pid's (the GPU's where the driver gives no per-process figures)."""
    truth = sc.truth()
    false_alarms = 0
    latency = None
    for pid, eps in alarms.episodes.items():
        leak = truth.get(pid)
        for start, _end, _severity in eps:
            if leak is None or start < leak.onset:
                false_alarms += 1
    episodes = 0
    for pid, leak in truth.items():
        if (pid == GPU) == sc.attributed:
            continue
        episodes = sum(1 for start, _, _ in alarms.episodes.get(pid, [])
                       if leak.onset - 1 <= start <= leak.stop)
        for start, end, severity in alarms.episodes.get(pid, []):
            if (end is None or end > leak.onset) and start >= leak.onset - 1:
                if leak.expected == "critical" and severity != "critical":
                    continue
                latency = start - leak.onset
                break
    return {"false_alarms": false_alarms, "latency": latency, "leaking": sc.leaking,
            "episodes": episodes}


def evaluate(seeds: int, hours: float, interval: float, only: list[str] | None = None,
             detectors: list[str] | None = None) -> dict:
    results: dict[str, dict[str, list]] = {}
    for seed in range(seeds):
        for sc in scenarios(seed, hours):
            if only and sc.name not in only:
                continue
            for name, fn in DETECTORS.items():
                if detectors and name not in detectors:
                    continue
                r = score(sc, fn(sc, seed, hours, interval))
                results.setdefault(sc.name, {}).setdefault(name, []).append(r)
    return results


def summary(results: dict) -> list[dict]:
    rows = []
    for scenario, by_det in results.items():
        for det, runs in by_det.items():
            lat = [r["latency"] for r in runs if r["latency"] is not None]
            rows.append({
                "scenario": scenario, "detector": det, "runs": len(runs),
                "false_alarms": sum(r["false_alarms"] for r in runs),
                "runs_with_false_alarms": sum(1 for r in runs if r["false_alarms"]),
                "detected": len(lat) if runs[0]["leaking"] else None,
                # firing episodes on the leaking series while it leaks (1 is the goal)
                "episodes_max": max(r["episodes"] for r in runs) if runs[0]["leaking"]
                else None,
                "latency_median_s": statistics.median(lat) if lat else None,
                "latency_max_s": max(lat) if lat else None,
            })
    return rows


def fmt_latency(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def print_table(rows: list[dict], out=sys.stdout) -> None:
    out.write("| scenario | detector | false alarms (runs with any) | detected | "
              "episodes per leak (max) | latency median | latency max |\n"
              "|---|---|---|---|---|---|---|\n")
    for r in rows:
        det = "n/a" if r["detected"] is None else f"{r['detected']}/{r['runs']}"
        eps = "-" if r.get("episodes_max") is None else r["episodes_max"]
        out.write(f"| {r['scenario']} | {r['detector']} | {r['false_alarms']} "
                  f"({r['runs_with_false_alarms']}/{r['runs']}) | {det} | {eps} | "
                  f"{fmt_latency(r['latency_median_s'])} | {fmt_latency(r['latency_max_s'])} |\n")


# -- replay speed ---------------------------------------------------------------------------


def replay_speed(hours: float = 24, interval: float = 5, gpus: int = 4, procs: int = 2) -> dict:
    """Every registered analyzer over a synthetic day: gpus x procs serving processes."""
    rng = random.Random(0)
    lives = [[_serving(rng, 2000 + g * 10 + k, transients=_transients(rng, hours, 2))
              for k in range(procs)] for g in range(gpus)]
    name, total = A100
    pipeline = Pipeline(Config(), None, strict=True)
    n = int(hours * 3600 / interval)
    built, elapsed = 0.0, 0.0
    for i in range(n):
        t = i * interval
        b0 = time.perf_counter()
        gs = []
        for g in range(gpus):
            ps = [ProcessSample(pid=life.pid, name="python3", create_time=T0,
                                used_memory_bytes=int(life.value(t, rng) or 0))
                  for life in lives[g]]
            gs.append(GpuSample(index=g, uuid=f"GPU-{g}", name=name, memory_total_bytes=total,
                                memory_used_bytes=sum(p.used_memory_bytes for p in ps),
                                processes=ps))
        tick = Tick(t=T0 + t, gpus=gs)
        b1 = time.perf_counter()
        pipeline.update(tick)
        elapsed += time.perf_counter() - b1
        built += b1 - b0
    return {"ticks": n, "gpus": gpus, "processes_per_gpu": procs,
            "analyzers": [type(a).__name__ for a in pipeline.analyzers],
            "pipeline_seconds": round(elapsed, 2), "per_tick_us": round(elapsed / n * 1e6, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--interval", type=float, default=3.0, help="sampling interval (s)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--scenario", action="append", metavar="NAME",
                    help="run only this scenario (repeatable)")
    ap.add_argument("--detector", action="append", metavar="NAME", choices=list(DETECTORS),
                    help="run only this detector (repeatable)")
    ap.add_argument("--replay-speed", action="store_true")
    args = ap.parse_args(argv)
    print(f"# {platform.python_implementation()} {platform.python_version()}, "
          f"{platform.machine()}, {platform.processor() or 'cpu'}")
    if args.replay_speed:
        print(json.dumps(replay_speed(), indent=2))
        return
    start = time.perf_counter()
    rows = summary(evaluate(args.seeds, args.hours, args.interval, args.scenario,
                            args.detector))
    print_table(rows)
    print(f"\n{args.seeds} seeds x {args.hours:g} h at {args.interval:g} s, "
          f"{time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
