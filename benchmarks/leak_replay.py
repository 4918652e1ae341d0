"""Score a real recording of tests/gpu/record_traces.py against its truth file.

    python -m benchmarks.leak_replay RECORDING TRUTH [--json OUT]
    python -m benchmarks.leak_replay tests/fixtures/traces/h200/h200-fill.jsonl.gz \\
        tests/fixtures/traces/h200/h200-fill.truth.json

Every process of the truth file (a restarted one is one process per pid) is judged on its
own `memory_leak` events, with expectations from its spec and its printed phases alone:

- a **leak** (`leak` ramps of the spec, started at its `leak_start` phase; or a `step`,
  started at its first `step` phase, its rate the mean of the steps) must fire within the
  issue's target from its onset: min(30 min, max(90 s, 400 MiB / r)), plus 5 min when it
  starts in the process's first minute, plus two step periods for steps, plus the time the
  allocator hid it (the longest stretch after the onset in which NVML's figure for the
  process did not grow, beyond a step period: a caching allocator serves a leak from blocks
  it holds already); only where the recording (and the process) lasted past that deadline
  — else it is `not due`;
- every other process must stay quiet (no firing event), except a `ramp_ratchet` (memory
  that grows steadily for minutes, then plateaus: flagging it is as defensible as not, so
  what happened is reported, not judged);
- the GPU's time to OOM, where the GPU hit the wall (its used memory reached the budget,
  or a process died of a real OOM: it printed no `exit` and left the recording before its
  end), must fire before the first of those.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field

from gpuwatch.config import Config
from gpuwatch.recording import read_recording
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.thresholds import load_table

MIB = 1 << 20
CRITICAL = 50.0  # MiB/s


def target(rate_mib_s: float, since_start: float, step_every: float = 0.0) -> float:
    base = min(1800.0, max(90.0, 400.0 / rate_mib_s))
    return base + (300.0 if since_start < 60 else 0.0) + 2 * step_every


@dataclass
class Verdict:
    name: str
    pid: int
    kind: str  # leak | quiet | report
    onset: float | None = None  # seconds into the recording
    rate: float | None = None  # MiB/s
    deadline: float | None = None
    events: list[tuple[float, str, str]] = field(default_factory=list)  # (t, state, severity)
    outcome: str = ""  # met | missed | not due | quiet | false alarm | reported
    latency: float | None = None
    hidden: float = 0.0  # seconds the allocator hid the leak from NVML (added to the target)

    @property
    def ok(self) -> bool:
        return self.outcome in ("met", "not due", "quiet", "reported")


def _processes(truth: dict) -> list[dict]:
    procs = truth["processes"]
    if isinstance(procs, dict):  # the first recorder's format: name -> {pid, phases}
        return [{"name": name, **p} for name, p in procs.items()]
    return procs


def _leak(spec: dict, phases: list[dict], used) -> tuple[float, float, float] | None:
    """(onset wall time, rate MiB/s, step period) of the process's leak, None without one.
    A truth file without the spec's rate (the first recorder's) has it measured: the rise
    of NVML's figure from the leak's start to its stop (or the end)."""
    start = next((p["t"] for p in phases if p["what"] == "leak_start"), None)
    if start is not None:
        rates = [r for r, _, _ in spec.get("leak", [])] or [
            p["rate"] for p in phases if p["what"] == "leak_start" and "rate" in p]
        if not rates:
            stop = next((p["t"] for p in phases if p["what"] == "leak_stop"), math.inf)
            pts = [(t, v) for t, v in used if start <= t <= stop]
            if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
                return None
            rates = [(pts[-1][1] - pts[0][1]) / MIB / (pts[-1][0] - pts[0][0])]
        return start, float(max(rates)), 0.0
    steps = [p["t"] for p in phases if p["what"] == "step"]
    if spec.get("step") and steps:
        mib, every, _ = spec["step"]
        return steps[0], mib / every, float(every)
    return None


def _hidden(used: list[tuple[float, int]], start: float, until: float) -> float:
    """The longest time after the leak's start (up to `until`) that NVML's figure for the
    process did not grow: its floor (the lowest of the last 15 s) stayed within 32 MiB. A
    caching allocator serving a leak from blocks it already holds hides it that long."""
    pts = [(t, v) for t, v in used if start <= t <= until]
    longest, ref, since = 0.0, None, start
    window: list[tuple[float, int]] = []
    for t, v in pts:
        window = [(tt, vv) for tt, vv in window if t - tt < 15] + [(t, v)]
        low = min(vv for _, vv in window)
        if ref is None or abs(low - ref) > 32 * MIB:
            ref, since = low, t
        longest = max(longest, t - since)
    return longest


def score(recording: str, truth_path: str) -> dict:
    with open(truth_path) as f:
        truth = json.load(f)
    _, ticks = read_recording(recording)
    pipeline = Pipeline(Config(), load_table(), strict=True)
    events, seen, first_t, last_t = [], {}, None, None
    used: dict[int, list[tuple[float, int]]] = {}
    full = None  # the first tick a GPU's used memory reached its budget: the wall
    for tick in ticks:
        if tick.gpus:
            first_t = tick.t if first_t is None else first_t
            last_t = tick.t
            for g in tick.gpus:
                row = (pipeline.analyzers[1].table.match(g.name, g.memory_total_bytes)
                       if g.memory_total_bytes else None)
                if (full is None and row is not None and g.memory_used_bytes is not None
                        and g.memory_used_bytes >= row.budget_bytes):
                    full = tick.t
                for p in g.processes:
                    seen.setdefault(p.pid, [tick.t, tick.t])[1] = tick.t
                    if p.used_memory_bytes is not None:
                        used.setdefault(p.pid, []).append((tick.t, p.used_memory_bytes))
        events += [e for e in pipeline.update(tick)
                   if e.signal in ("memory_leak", "time_to_oom")]
    t0 = truth.get("recording_start", first_t)
    end = (last_t or t0) - t0
    specs = truth.get("specs", {})
    out: list[Verdict] = []
    oom_deaths = []
    for proc in _processes(truth):
        name, pid, phases = proc["name"], proc["pid"], proc["phases"]
        spec = specs.get(name, {})
        mine = [(e.t - t0, e.state, e.severity) for e in events
                if e.signal == "memory_leak" and e.pid == pid]
        started = next((p["t"] for p in phases if p["what"] == "start"), None)
        gone = seen.get(pid, [None, None])[1]
        exited = any(p["what"] == "exit" for p in phases)
        if gone is not None and not exited and gone - t0 < end - 10:
            oom_deaths.append(gone - t0)  # left early without saying so: a real OOM
        life_end = (gone - t0) if gone is not None else end
        leak = _leak(spec, phases, used.get(pid, []))
        if leak is None:
            kind = "report" if spec.get("ramp_ratchet") else "quiet"
            v = Verdict(name, pid, kind, events=mine)
            firing = [e for e in mine if e[1] == "firing"]
            v.outcome = "reported" if kind == "report" else (
                "false alarm" if firing else "quiet")
            out.append(v)
            continue
        onset_wall, rate, every = leak
        onset = onset_wall - t0
        since_start = onset_wall - started if started is not None else math.inf
        due = onset_wall + target(rate, since_start, every)
        # the floor's own 15 s do not count, nor a step leak's flat stretches between steps
        hidden = max(0.0, _hidden(used.get(pid, []), onset_wall, due) - 15.0 - every)
        deadline = due + hidden - t0
        v = Verdict(name, pid, "leak", onset, rate, deadline, mine, hidden=hidden)
        first = next((t for t, state, _ in mine if state == "firing" and t >= onset - 1), None)
        early = [t for t, state, _ in mine if state == "firing" and t < onset - 1]
        v.latency = None if first is None else round(first - onset, 1)
        if early:
            v.outcome = "false alarm"
        elif first is not None and first <= deadline:
            v.outcome = "met"
        elif deadline > min(end, life_end):
            v.outcome = "not due"
        else:
            v.outcome = "missed"
        out.append(v)
    tto = [e.t - t0 for e in events if e.signal == "time_to_oom" and e.state == "firing"]
    walls = oom_deaths + ([full - t0] if full is not None else [])
    wall = min(walls) if walls else None
    return {
        "processes": out,
        "gpu_leak_events": [(e.t - t0, e.state, e.severity) for e in events
                            if e.signal == "memory_leak" and e.pid is None],
        "time_to_oom": tto,
        "time_to_oom_messages": [e.message for e in events
                                 if e.signal == "time_to_oom" and e.state == "firing"],
        "first_oom": wall,
        "time_to_oom_before_oom": None if wall is None else bool(tto and tto[0] < wall),
        "seconds": end,
    }


def report(r: dict) -> str:
    lines = []
    for v in r["processes"]:
        evs = ", ".join(f"{state} {sev} at {t:.0f} s" for t, state, sev in v.events) or "quiet"
        hid = f" (hidden {v.hidden:.0f} s)" if v.hidden else ""
        what = (f"leak {v.rate:g} MiB/s from {v.onset:.0f} s, due by {v.deadline:.0f} s{hid}"
                if v.kind == "leak" else "no leak" if v.kind == "quiet" else "ratchet")
        lat = f", latency {v.latency:.0f} s" if v.latency is not None else ""
        lines.append(f"{v.name} (pid {v.pid}): {what}: {v.outcome}{lat} [{evs}]")
    lines.append(f"GPU's own leak series: {r['gpu_leak_events'] or 'quiet'}")
    first = r["first_oom"]
    lines.append(f"time to OOM fired at {[round(t) for t in r['time_to_oom']]}; the wall "
                 f"{'never' if first is None else f'at {first:.0f} s'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recording")
    ap.add_argument("truth")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    r = score(args.recording, args.truth)
    print(report(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**r, "processes": [vars(v) for v in r["processes"]]}, f, indent=1)


if __name__ == "__main__":
    main()
