"""Leak detection at every rate: the family of issue 19 (rates, onsets, noise, no-leak hosts).

Two parts, generated from seeds on an H200 (143771 MiB, 2 s ticks, memory in 2 MiB pages):

- **Leaks**: one process loads its weights in 512 MiB bursts and serves; a leak of rate r
  starts `onset` seconds after the process started (0, 30 s, 2 min, 10 min, 1 h), on one
  of several kinds of noise: none (a few MiB of jitter), churn of 0.5-1.5 GiB given back
  within seconds, an allocator sawtooth of period 1-10 min, a ratchet that plateaus
  (dynamic shapes), three neighbours on the same GPU, and GPU-only accounting (the driver
  gives no per-process figures: only the GPU's series can tell). Rates: 11 log-spaced from
  12 MiB/min to 200 MiB/s. Also stepwise leaks (64 MiB-1 GiB kept every 30 s-10 min) and
  leaks that stop.
- **No-leak hosts**: several processes per GPU, 4 h each, doing what serving hosts do:
  loads in bursts, a slow smooth load (100 MiB/s for 3 min), vLLM-style pool allocation
  (weights, a profiling peak, the KV pool in a few chunks, CUDA-graph capture), dynamic-shape
  growth that plateaus, reloads, restarts under a new pid, sleep and wake; under churn,
  sawtooth or transients.

Target for a leak of rate r: min(30 min, max(90 s, 400 MiB / r)) from its onset, plus the
period of the sawtooth in the series judged where there is one (under GPU-only accounting the
GPU's sum holds a neighbour's), plus 5 min when the leak starts in the process's first
minute; a stepwise leak's r is its average and it may take two step periods more (its third
step: one step, or two, could be transients); 50 MiB/s and more is critical within 60 s
once loading is over (plus the sawtooth's period).

    python -m benchmarks.leak_rates [--seeds 3] [--host-hours 200] [--json OUT] [--md OUT]
    python -m benchmarks.leak_rates --only leaks --rate 20 --noise churn --onset 0

Scores: per leak case, the latency from onset to the first alarm on the leaking series (the
GPU's for GPU-only accounting), against its target, the firing episodes while it leaks (one
is the goal) and, for a leak that stops, its resolves (one); per no-leak host, false
episodes on per-process series and on the GPU's own series, and time-to-OOM episodes.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import platform
import random
import sys
import time
import zlib
from dataclasses import dataclass, field

from gpuwatch.config import Config
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.pipeline import Pipeline

MIB = 1 << 20
GIB = 1 << 30
T0 = 1_790_000_000.0
H200 = ("NVIDIA H200", 143771 * MIB)
PAGE = 2 * MIB
INTERVAL = 2.0
CONTEXT = 500 * MIB  # CUDA context of every process
GPU_ONLY = -1  # the GPU's own series, scored as a pid
RATES = [0.2 * 1000 ** (i / 10) for i in range(11)]  # MiB/s: 12 MiB/min ... 200 MiB/s
ONSETS = [0.0, 30.0, 120.0, 600.0, 3600.0]
NOISES = ["none", "churn", "sawtooth", "ratchet", "neighbours", "gpu_only"]
STEPS = [(64, 30), (64, 120), (256, 30), (256, 120), (256, 600), (1024, 30), (1024, 120),
         (1024, 600)]  # (MiB, every s); 64 MiB every 10 min is below the warning slope
CRIT = 50 * MIB


def target(rate: float, onset: float, period: float = 0.0, step_every: float = 0.0) -> float:
    """Seconds from onset within which a leak of `rate` bytes/s must be flagged: a
    stepwise leak's rate is its average, and it may take two step periods more (its third
    step: one step, or two, could be transients that have not come back down yet)."""
    base = min(1800.0, max(90.0, 400 * MIB / rate))
    return base + period + 2 * step_every + (300.0 if onset < 60 else 0.0)


# -- what a process does ------------------------------------------------------------------------


@dataclass
class Leak:
    onset: float  # seconds after the process started
    rate: float = 0.0  # bytes/s (ramp)
    step: float = 0.0  # bytes kept every `every` seconds (steps)
    every: float = 0.0
    stop: float = math.inf  # seconds after the process started

    def bytes_at(self, age: float) -> float:
        if age < self.onset:
            return 0.0
        dt = min(age, self.stop) - self.onset
        if self.step:
            return self.step * (1 + math.floor(dt / self.every))
        return self.rate * dt

    @property
    def mean_rate(self) -> float:
        return self.step / self.every if self.step else self.rate


@dataclass
class Proc:
    """One process: loads, warms up, serves under some noise; maybe leaks. Times are seconds
    after its own start; memory is a pure function of time (and its seed)."""

    pid: int
    start: float  # seconds into the trace
    seed: int
    end: float = math.inf
    load: str = "bursts"  # bursts | smooth | pool | none
    weights: float = 8 * GIB
    load_rate: float = 100 * MIB  # smooth loads
    capture: float = 0.0  # CUDA-graph capture after loading: bytes over capture_seconds
    capture_seconds: float = 20.0
    peak: float = 0.0  # a profiling peak after loading that comes back down
    noise: str = "none"  # none | churn | sawtooth | ratchet | transients
    jitter: float = 2 * MIB
    saw_amp: float = 512 * MIB
    saw_period: float = 300.0
    ratchet_max: float = 3 * GIB
    leak: Leak | None = None
    reloads: list[float] = field(default_factory=list)  # ages: memory given back, loaded again
    sleeps: list[tuple[float, float]] = field(default_factory=list)  # (age, seconds asleep)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        # bursts: 512 MiB each, 2.5-5.5 s apart (model shards)
        n = max(1, int(self.weights // (512 * MIB)))
        self._bursts = list(_cumsum(rng.uniform(2.5, 5.5) for _ in range(n)))
        self.load_seconds = {"bursts": self._bursts[-1], "smooth": self.weights / self.load_rate,
                             "pool": 4.0, "none": 0.0}[self.load]
        self._saw_phase = rng.uniform(0, self.saw_period)
        self._churn = self._transients = []
        if self.noise == "churn":
            self._churn = _schedule(rng, 0.5, (1.0, 2.5), (0.3, 1.5), (0.5 * GIB, 1.5 * GIB),
                                    6 * 3600)
        elif self.noise == "transients":
            self._transients = _schedule(rng, 1.0, (60.0, 600.0), (600.0, 2400.0),
                                         (200 * MIB, 800 * MIB), 6 * 3600)
        # dynamic shapes: one working buffer a second, size max x u^2, cached: a new record
        # size grows the allocator's pool, ever more rarely
        recs, top = [], 0.0
        for i in range(4 * 3600 if self.noise == "ratchet" else 0):
            size = self.ratchet_max * rng.random() ** 2
            if size > top + PAGE:
                top = size
                recs.append((float(i), size))
        self._ratchet_t = [t for t, _ in recs]
        self._ratchet_v = [v for _, v in recs]

    def _cycle_age(self, age: float) -> float | None:
        """Age within the current load cycle (reloads and wakes load again); None: the
        memory is given back (asleep, or the moment of a reload)."""
        base = 0.0
        for at in self.reloads:
            if age >= at:
                base = at + 20.0
        for at, dur in self.sleeps:
            if at <= age < at + dur:
                return None
            if age >= at + dur:
                base = max(base, at + dur)
        if age < base:
            return None
        return age - base

    def value(self, age: float, rng: random.Random) -> float:
        cyc = self._cycle_age(age)
        if cyc is None:
            return CONTEXT + 300 * MIB
        v = CONTEXT + self._loaded(cyc)
        serving = cyc - self.load_seconds
        if serving >= 0:
            if self.capture:
                v += self.capture * min(1.0, serving / self.capture_seconds)
            if self.peak and serving < 15:
                v += self.peak
            v += self._noise(age, serving)
        if self.leak is not None:
            v += self.leak.bytes_at(age)
        v += rng.gauss(0.0, self.jitter)
        return max(0.0, v // PAGE * PAGE)

    def _loaded(self, cyc: float) -> float:
        if self.load == "smooth":
            return min(self.weights, self.load_rate * cyc)
        if self.load == "pool":
            return self.weights * min(4, int(cyc) + 1) / 4
        if self.load == "none":
            return 0.0
        return 512 * MIB * bisect.bisect_right(self._bursts, cyc)

    def _noise(self, age: float, serving: float) -> float:
        if self.noise == "churn":
            return _active(self._churn, age)
        if self.noise == "transients":
            return _active(self._transients, age)
        if self.noise == "sawtooth":
            return self.saw_amp * (((serving + self._saw_phase) % self.saw_period)
                                   / self.saw_period)
        if self.noise == "ratchet":
            i = bisect.bisect_right(self._ratchet_t, serving)
            return self._ratchet_v[i - 1] if i else 0.0
        return 0.0


def _cumsum(xs):
    t = 0.0
    for x in xs:
        t += x
        yield t


def _schedule(rng, p_on, dur, gap, amp, horizon):
    """(start, end, bytes) of transients: each gap, one starts with probability p_on."""
    out, t = [], 0.0
    while t < horizon:
        t += rng.uniform(*gap)
        if rng.random() < p_on:
            d = rng.uniform(*dur)
            out.append((t, t + d, rng.uniform(*amp)))
            t += d
    return out


def _active(sched, t: float) -> float:
    i = bisect.bisect_right(sched, (t, math.inf, math.inf)) - 1
    if i >= 0 and sched[i][0] <= t < sched[i][1]:
        return sched[i][2]
    return 0.0


# -- cases ------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    procs: list[Proc]
    seconds: float
    leaker: int | None = None  # pid (GPU_ONLY: the GPU's series)
    leak: Leak | None = None
    attributed: bool = True
    rate: float = 0.0
    onset: float = 0.0  # after the leaking process's start
    noise: str = ""
    goal: float = 0.0  # seconds from onset
    critical_within: float | None = None  # critical expected this soon after onset
    kind: str = "ramp"  # ramp | steps | stop

    @property
    def onset_t(self) -> float:
        lk = next(p for p in self.procs if p.leak is not None)
        return lk.start + lk.leak.onset  # type: ignore[union-attr]


def _leaker(seed: int, pid: int, noise: str, leak: Leak, start: float) -> Proc:
    rng = random.Random(seed)
    kw: dict = {"weights": rng.uniform(2, 8) * GIB, "jitter": rng.uniform(1, 4) * MIB}
    if noise == "sawtooth":
        kw.update(noise="sawtooth", saw_period=rng.choice([60.0, 180.0, 600.0]),
                  saw_amp=rng.uniform(128, 1024) * MIB)
    elif noise in ("churn", "ratchet"):
        kw["noise"] = noise
    return Proc(pid, start, seed, leak=leak, **kw)


def _neighbours(seed: int, start: float) -> list[Proc]:
    rng = random.Random(seed + 77)
    return [
        Proc(3001, start - 1800, seed + 1, weights=rng.uniform(10, 30) * GIB, noise="churn"),
        Proc(3002, start - 3600, seed + 2, weights=rng.uniform(4, 12) * GIB, noise="sawtooth",
             saw_period=rng.uniform(60, 600), saw_amp=rng.uniform(128, 1024) * MIB),
        Proc(3003, start - 600, seed + 3, weights=rng.uniform(2, 8) * GIB, noise="transients"),
    ]


def leak_cases(seed: int, rates=RATES, onsets=ONSETS, noises=NOISES) -> list[Case]:
    out = []
    for noise in noises:
        for onset in onsets:
            for rate_mib in rates:
                rate = rate_mib * MIB
                s = zlib.crc32(f"{seed}/{noise}/{onset}/{rate_mib:.3f}".encode())
                start = 600.0  # the leaking process starts 10 min into the trace
                lk = Leak(onset, rate)
                proc = _leaker(s, 2001, noise, lk, start)
                procs = [proc] + (_neighbours(s, start) if noise in ("neighbours", "gpu_only")
                                  else [])
                # the sawtooth in the series judged: the leaker's, or under GPU-only
                # accounting any member's of the GPU's sum
                judged = procs if noise == "gpu_only" else [proc]
                period = max((p.saw_period for p in judged if p.noise == "sawtooth"),
                             default=0.0)
                goal = target(rate, onset, period)
                # long enough to see it found, and bounded by what the GPU can hold
                room = 100 * GIB / rate
                seconds = start + onset + min(goal + 600, max(room, goal + 120))
                out.append(Case(
                    f"{noise}/onset {onset:g}s/{rate_mib:.3g} MiB/s", procs, seconds,
                    GPU_ONLY if noise == "gpu_only" else 2001, lk,
                    attributed=noise != "gpu_only", rate=rate, onset=onset, noise=noise,
                    goal=goal, critical_within=(60.0 + period if rate >= CRIT and onset >= 120
                                                and noise != "gpu_only" else None)))
    return out


def step_cases(seed: int) -> list[Case]:
    out = []
    for size_mib, every in STEPS:
        for noise in ("none", "churn"):
            s = zlib.crc32(f"{seed}/steps/{size_mib}/{every}/{noise}".encode())
            lk = Leak(600.0, step=size_mib * MIB, every=every)
            proc = _leaker(s, 2001, noise, lk, 600.0)
            goal = target(lk.mean_rate, lk.onset, step_every=every)
            out.append(Case(f"steps {size_mib} MiB every {every:g}s/{noise}", [proc],
                            600 + 600 + goal + 600, 2001, lk, rate=lk.mean_rate,
                            onset=600.0, noise=noise, goal=goal, kind="steps"))
    return out


def stop_cases(seed: int) -> list[Case]:
    """Leaks that stop: one episode, one resolve after it stops."""
    out = []
    for rate_mib, dur in ((0.4, 3600.0), (2.0, 1200.0), (10.0, 600.0), (60.0, 300.0)):
        for noise in ("none", "churn", "sawtooth"):
            s = zlib.crc32(f"{seed}/stop/{rate_mib}/{noise}".encode())
            lk = Leak(900.0, rate_mib * MIB, stop=900.0 + dur)
            proc = _leaker(s, 2001, noise, lk, 600.0)
            period = proc.saw_period if noise == "sawtooth" else 0.0
            out.append(Case(f"stops after {dur:g}s {rate_mib:g} MiB/s/{noise}", [proc],
                            600 + 900 + dur + 3600, 2001, lk, rate=lk.rate, onset=900.0,
                            noise=noise, goal=target(lk.rate, 900.0, period), kind="stop"))
    return out


# -- no-leak hosts ----------------------------------------------------------------------------


def host(seed: int, hours: float = 4.0) -> Case:
    """A GPU with 3-6 processes doing what serving hosts do, none leaking."""
    rng = random.Random(seed * 31337)
    end = hours * 3600
    procs: list[Proc] = []
    pid = 5000

    def add(**kw) -> None:
        nonlocal pid
        pid += 1
        kw.setdefault("noise", rng.choice(["none", "churn", "sawtooth", "transients"]))
        kw.setdefault("saw_period", rng.uniform(60, 600))
        kw.setdefault("saw_amp", rng.uniform(128, 1024) * MIB)
        kw.setdefault("jitter", rng.uniform(1, 4) * MIB)
        procs.append(Proc(pid, seed=rng.randrange(1 << 30), **kw))

    kinds = rng.sample(["bursts", "slow_load", "vllm", "dynamic", "reload", "restart",
                        "sleep"], k=rng.randint(3, 6))
    for kind in kinds:
        start = rng.uniform(0, 1800) if rng.random() < 0.7 else -3600.0
        weights = rng.uniform(4, 20) * GIB
        if kind == "bursts":
            add(start=start, weights=rng.uniform(4, 40) * GIB,
                capture=rng.choice([0.0, rng.uniform(0.3, 2) * GIB]),
                capture_seconds=rng.uniform(10, 40), peak=rng.uniform(0, 2) * GIB)
        elif kind == "slow_load":
            add(start=start, load="smooth", weights=18 * GIB, load_rate=100 * MIB)
        elif kind == "vllm":
            # weights in bursts, then the KV pool in chunks, then graph capture (one process)
            add(start=start, load="pool", weights=rng.uniform(20, 40) * GIB,
                capture=rng.uniform(0.5, 2) * GIB, capture_seconds=rng.uniform(10, 30),
                peak=rng.uniform(1, 4) * GIB, noise="none")
        elif kind == "dynamic":
            add(start=start, weights=weights, noise="ratchet",
                ratchet_max=rng.uniform(1, 6) * GIB)
        elif kind == "reload":
            add(start=start, weights=weights,
                reloads=sorted(rng.uniform(1800, end - start) for _ in range(2)))
        elif kind == "restart":
            every = rng.uniform(120, 1800)
            t = start
            while t < end:
                life = every * rng.uniform(0.8, 1.2)
                add(start=t, end=t + life, weights=weights)
                t += life + rng.uniform(2, 20)
        elif kind == "sleep":
            naps = []
            t = rng.uniform(600, 1800)
            while t < end:
                naps.append((t, rng.uniform(60, 600)))
                t += rng.uniform(1200, 3600)
            add(start=start, weights=rng.uniform(20, 50) * GIB, load="pool", noise="none",
                sleeps=naps)
    return Case(f"host {seed}", procs, end, None, None)


# -- running and scoring ----------------------------------------------------------------------


def ticks(case: Case):
    rng = random.Random(zlib.crc32(case.name.encode()))
    name, total = H200
    n = int(case.seconds / INTERVAL)
    for i in range(n):
        t = i * INTERVAL
        procs, used = [], 600.0 * MIB
        for p in case.procs:
            if not p.start <= t < p.end:
                continue
            v = p.value(t - p.start, rng)
            used += v
            procs.append(ProcessSample(pid=p.pid, name="python3", create_time=T0 + p.start,
                                       used_memory_bytes=int(v) if case.attributed else None))
        yield Tick(t=T0 + t, gpus=[GpuSample(
            index=0, uuid="GPU-rates-0", name=name, memory_total_bytes=total,
            memory_used_bytes=int(min(used, total)), processes=procs)])


def run_deriv(case: Case, window: float, crit_window: float = 120.0,
              hold: float = 0.0) -> list[tuple[int, float, str, str, str]]:
    """What a hand-written PromQL rule does: deriv() (least squares over the raw samples)
    of each process's memory (the GPU's used memory without per-process figures) over
    `window` at 12 MiB/min, over `crit_window` at 50 MiB/s, less the same 10 % tolerance,
    held `hold` seconds (`for:`); events as run() gives them."""
    from benchmarks.leak_detection import TOLERANCE, OlsWindow

    warn, crit = 12 * MIB / 60 * (1 - TOLERANCE), CRIT * (1 - TOLERANCE)
    state: dict[int, list] = {}
    out = []
    for tick in ticks(case):
        t = tick.t - T0
        g = tick.gpus[0]
        series = [(p.pid, p.used_memory_bytes) for p in g.processes
                  if p.used_memory_bytes is not None] if case.attributed else [
            (GPU_ONLY, g.memory_used_bytes)]
        for pid in [p for p in state if p not in {s for s, _ in series}]:
            if state[pid][3]:
                out.append((pid, t, "memory_leak", "resolved", state[pid][3]))
            del state[pid]
        for pid, v in series:
            w, c, since, sev = state.setdefault(pid, [OlsWindow(window), OlsWindow(crit_window),
                                                      None, None])
            sw, sc = w.add(tick.t, v), c.add(tick.t, v)
            now = ("critical" if sc is not None and sc >= crit else
                   "warning" if sw is not None and sw >= warn else None)
            if now is None:
                since = None
            elif since is None:
                since = t
            fire = now if now is not None and t - since >= hold else None
            if fire != sev:
                if sev is not None:
                    out.append((pid, t, "memory_leak", "resolved", sev))
                if fire is not None:
                    out.append((pid, t, "memory_leak", "firing", fire))
            state[pid][2:] = [since, fire]
    return out


DETECTORS = {
    "gpuwatch": lambda case: run(case),
    "deriv 10m": lambda case: run_deriv(case, 600.0),
    "deriv 24m for 5m": lambda case: run_deriv(case, 1440.0, hold=300.0),
}


def run(case: Case) -> list[tuple[int, float, str, str, str]]:
    """(pid, seconds into the trace, signal, state, severity) of leak and time-to-OOM events;
    pid GPU_ONLY for the GPU's own series."""
    pipeline = Pipeline(Config(), None, strict=True)
    out = []
    for tick in ticks(case):
        for ev in pipeline.update(tick):
            if ev.signal in ("memory_leak", "time_to_oom"):
                out.append((GPU_ONLY if ev.pid is None else ev.pid, ev.t - T0, ev.signal,
                            ev.state, ev.severity))
    return out


def score(case: Case, events) -> dict:
    leak_events = [e for e in events if e[2] == "memory_leak"]
    onset = case.onset_t if case.leak is not None else math.inf
    stop = (onset - case.leak.onset + case.leak.stop) if case.leak is not None else math.inf
    false = sum(1 for pid, t, _, state, _ in leak_events if state == "firing"
                and (pid != case.leaker or t < onset - 1)
                and not (pid == GPU_ONLY and not case.attributed and case.leaker != GPU_ONLY))
    mine = [e for e in leak_events if e[0] == case.leaker and e[1] >= onset - 1]
    first = next((t for _, t, _, state, _ in mine if state == "firing"), None)
    crit = next((t for _, t, _, state, sev in mine if state == "firing" and sev == "critical"),
                None)
    episodes, resolves, open_ = 0, 0, False
    for _, _, _, state, _ in mine:
        if state == "resolved":
            open_ = False
            resolves += 1
        elif not open_:
            open_ = True
            episodes += 1
    tto = sum(1 for e in events if e[2] == "time_to_oom" and e[3] == "firing")
    return {
        "case": case.name, "kind": case.kind, "noise": case.noise, "onset": case.onset,
        "rate_mib_s": case.rate / MIB, "goal_s": case.goal,
        "latency_s": None if first is None else round(first - onset, 1),
        "critical_latency_s": None if crit is None else round(crit - onset, 1),
        "critical_within_s": case.critical_within,
        "episodes": episodes, "resolves": resolves,
        "resolved_after_stop_s": (None if case.kind != "stop" or not resolves else round(
            next(t for _, t, _, s, _ in mine if s == "resolved") - stop, 1)),
        "false_episodes": false, "time_to_oom_episodes": tto,
        "met": _met(case, first, crit, onset, episodes, resolves),
    }


def _met(case, first, crit, onset, episodes, resolves) -> bool:
    if first is None or first - onset > case.goal or episodes != 1:
        return False
    if case.critical_within is not None and (crit is None or crit - onset > case.critical_within):
        return False
    return not (case.kind == "stop" and resolves != 1)


def score_host(case: Case, events) -> dict:
    procs = sum(1 for e in events if e[2] == "memory_leak" and e[3] == "firing"
                and e[0] != GPU_ONLY)
    gpu = sum(1 for e in events if e[2] == "memory_leak" and e[3] == "firing"
              and e[0] == GPU_ONLY)
    tto = sum(1 for e in events if e[2] == "time_to_oom" and e[3] == "firing")
    return {"case": case.name, "hours": case.seconds / 3600, "processes": len(case.procs),
            "false_process_episodes": procs, "false_gpu_episodes": gpu,
            "time_to_oom_episodes": tto,
            "events": [list(e) for e in events][:20]}


# -- tables -----------------------------------------------------------------------------------


def fmt(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def latency_table(rows: list[dict], out=sys.stdout) -> None:
    """Worst latency over seeds per rate (rows) x onset (columns), one table per noise."""
    ramps = [r for r in rows if r["kind"] == "ramp"]
    for noise in dict.fromkeys(r["noise"] for r in ramps):
        out.write(f"\n**{noise}** (worst of the seeds; target in brackets; ✗ missed)\n\n")
        onsets = sorted({r["onset"] for r in ramps if r["noise"] == noise})
        out.write("| rate | " + " | ".join(f"onset {fmt(o) if o else '0 s'}" for o in onsets)
                  + " |\n|---|" + "---|" * len(onsets) + "\n")
        for rate in sorted({r["rate_mib_s"] for r in ramps if r["noise"] == noise}):
            cells = []
            for o in onsets:
                runs = [r for r in ramps if r["noise"] == noise and r["onset"] == o
                        and r["rate_mib_s"] == rate]
                cells.append(_cell(runs))
            out.write(f"| {_rate(rate)} | " + " | ".join(cells) + " |\n")


def _cell(runs: list[dict]) -> str:
    if not runs:
        return ""
    lat = [r["latency_s"] for r in runs]
    worst = None if None in lat else max(lat)
    ok = all(r["met"] for r in runs)
    crit = [r["critical_latency_s"] for r in runs if r["critical_within_s"] is not None]
    extra = f", crit {fmt(max(crit))}" if crit and None not in crit else (
        ", crit -" if crit else "")
    return f"{fmt(worst)}{extra} ({fmt(runs[0]['goal_s'])}){'' if ok else ' ✗'}"


def _rate(mib_s: float) -> str:
    return f"{mib_s * 60:.0f} MiB/min" if mib_s < 1 else f"{mib_s:.3g} MiB/s"


def other_table(rows: list[dict], kind: str, out=sys.stdout) -> None:
    sel = [r for r in rows if r["kind"] == kind]
    if not sel:
        return
    out.write(f"\n| {kind} case | latency (worst) | target | episodes (max) | resolves | "
              "resolved after stop (worst) | met |\n|---|---|---|---|---|---|---|\n")
    for name in dict.fromkeys(r["case"] for r in sel):
        runs = [r for r in sel if r["case"] == name]
        lat = [r["latency_s"] for r in runs]
        after = [r["resolved_after_stop_s"] for r in runs if r["resolved_after_stop_s"]]
        out.write(f"| {name} | {fmt(None if None in lat else max(lat))} | "
                  f"{fmt(runs[0]['goal_s'])} | {max(r['episodes'] for r in runs)} | "
                  f"{'/'.join(str(r['resolves']) for r in runs)} | "
                  f"{fmt(max(after)) if after else '-'} | "
                  f"{sum(r['met'] for r in runs)}/{len(runs)} |\n")


def host_table(rows: list[dict], out=sys.stdout) -> None:
    hours = sum(r["hours"] for r in rows)
    procs = sum(r["false_process_episodes"] for r in rows)
    gpu = sum(r["false_gpu_episodes"] for r in rows)
    tto = sum(r["time_to_oom_episodes"] for r in rows)
    out.write(f"\nNo-leak hosts: {len(rows)} hosts, {hours:.0f} host-hours, "
              f"{sum(r['processes'] for r in rows)} processes: {procs} false episodes on "
              f"process series ({procs / hours * 24:.2f} per host-day), {gpu} on the GPU's "
              f"own series, {tto} time-to-OOM episodes\n")


def summary_table(results: list[dict], out=sys.stdout) -> None:
    """The docs' table: per rate, the worst latency over onsets, noises and seeds, in the
    process's first minute and after it, against the target; false episodes per host-day."""
    dets = [r["detector"] for r in results]
    out.write("| rate | target (onset ≥ 2 min) | " + " | ".join(dets) + " | target (first minute)"
              " | " + " | ".join(dets) + " |\n|---|---|" + "---|" * len(dets) + "---|"
              + "---|" * len(dets) + "\n")
    rates = sorted({r["rate_mib_s"] for r in results[0]["leaks"] if r["kind"] == "ramp"})
    for rate in rates:
        cells = [_rate(rate)]
        for early in (False, True):
            goal = None
            for res in results:
                runs = [r for r in res["leaks"] if r["kind"] == "ramp" and r["rate_mib_s"] == rate
                        and (r["onset"] < 60) == early and r["noise"] in ("none", "churn",
                                                                          "neighbours", "ratchet")]
                goal = max(r["goal_s"] for r in runs)
                lat = [r["latency_s"] for r in runs]
                missed = sum(1 for r in runs if not r["met"])
                cells_r = "missed" if None in lat and all(x is None for x in lat) else (
                    f"{fmt(max(x for x in lat if x is not None))}"
                    + (f" ({missed}/{len(runs)} over target)" if missed else ""))
                if res is results[0]:
                    cells.append(fmt(goal))
                cells.append(cells_r)
        out.write("| " + " | ".join(cells) + " |\n")
    out.write("\n| false episodes per host-day (no-leak hosts) | " + " | ".join(dets)
              + " |\n|---|" + "---|" * len(dets) + "\n")
    for what, key in (("per-process series", "false_process_episodes"),
                      ("the GPU's own series", "false_gpu_episodes"),
                      ("time to OOM", "time_to_oom_episodes")):
        cells = []
        for res in results:
            hours = sum(h["hours"] for h in res["hosts"]) or math.nan
            cells.append(f"{sum(h.get(key, 0) for h in res['hosts']) / hours * 24:.2f}")
        out.write(f"| {what} | " + " | ".join(cells) + " |\n")


# -- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--host-hours", type=float, default=200.0)
    ap.add_argument("--only", choices=["leaks", "steps", "stops", "hosts"], action="append")
    ap.add_argument("--rate", type=float, action="append", help="MiB/s (repeatable)")
    ap.add_argument("--onset", type=float, action="append")
    ap.add_argument("--noise", action="append", choices=NOISES)
    ap.add_argument("--json", help="raw results")
    ap.add_argument("--md", help="tables")
    ap.add_argument("--verbose", action="store_true", help="each case's events")
    ap.add_argument("--detector", choices=list(DETECTORS), default="gpuwatch")
    ap.add_argument("--summary", action="append", metavar="JSON",
                    help="print the docs' table from these raw results (one per detector)")
    args = ap.parse_args(argv)
    if args.summary:
        summary_table([json.load(open(p)) for p in args.summary])  # noqa: SIM115
        return
    detect = DETECTORS[args.detector]
    only = set(args.only or ["leaks", "steps", "stops", "hosts"])
    started = time.perf_counter()
    rows, hosts = [], []
    for seed in range(args.seeds):
        cases: list[Case] = []
        if "leaks" in only:
            cases += leak_cases(seed, [r for r in RATES if not args.rate or any(
                abs(r - x) / x < 0.05 for x in args.rate)], args.onset or ONSETS,
                args.noise or NOISES)
        if "steps" in only:
            cases += step_cases(seed)
        if "stops" in only:
            cases += stop_cases(seed)
        for case in cases:
            events = detect(case)
            r = score(case, events)
            r["seed"] = seed
            rows.append(r)
            if args.verbose or not r["met"]:
                print(f"{'ok  ' if r['met'] else 'MISS'} seed {seed} {case.name}: latency "
                      f"{fmt(r['latency_s'])} (goal {fmt(r['goal_s'])}), crit "
                      f"{fmt(r['critical_latency_s'])}, episodes {r['episodes']}, resolves "
                      f"{r['resolves']}, false {r['false_episodes']}", file=sys.stderr)
    if "hosts" in only:
        n = math.ceil(args.host_hours / 4)
        for seed in range(n):
            case = host(seed)
            r = score_host(case, detect(case))
            hosts.append(r)
            if r["false_process_episodes"] or r["false_gpu_episodes"] or args.verbose:
                print(f"host {seed}: {r['false_process_episodes']} process, "
                      f"{r['false_gpu_episodes']} GPU, {r['time_to_oom_episodes']} TTO: "
                      f"{r['events'][:6]}", file=sys.stderr)
    elapsed = time.perf_counter() - started
    out = open(args.md, "w") if args.md else sys.stdout  # noqa: SIM115
    out.write(f"# {args.detector}; {platform.python_implementation()} "
              f"{platform.python_version()}, {platform.machine()}; {args.seeds} seeds; "
              f"{elapsed:.0f} s\n")
    if rows:
        met = sum(r["met"] for r in rows)
        false = sum(r["false_episodes"] for r in rows)
        out.write(f"\nLeak cases: {met}/{len(rows)} met their target; {false} false episodes "
                  f"(other series, or before the onset)\n")
        latency_table(rows, out)
        other_table(rows, "steps", out)
        other_table(rows, "stop", out)
    if hosts:
        host_table(hosts, out)
    if args.md:
        out.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"detector": args.detector, "leaks": rows, "hosts": hosts,
                       "seconds": round(elapsed)}, f, indent=1)


if __name__ == "__main__":
    main()
