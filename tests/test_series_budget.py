"""The series budget per host (signals/budget.py, exporter/fold.py): per-process series only for
the processes that matter, the rest summed per GPU and owner, no verdict, event or alert lost.

The budget test counts the real exposition of a real daemon (`--simulate large`), so families
added later count against it too."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest

from gpuwatch.config import load
from gpuwatch.events import Event
from gpuwatch.exporter.fold import PER_PROCESS
from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, ProbeSample, ProcessSample, Tick
from gpuwatch.signals.budget import Budget, BudgetConfig
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.sources.simulate import SimulatedBackend
from gpuwatch.thresholds import load_table
from tests.helpers import wait_until

BUDGET = 1000  # series per host at defaults, `--simulate large` (DESIGN.md, docs/metrics.md)
MAX_LABELS = 15
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(body: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in body.splitlines():
        if line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, line
            out.append((m[1], dict(LABEL.findall(m[2] or "")), float(m[3])))
    return out


def families_with_pid(body: str) -> set[str]:
    """Family names (as the fold registers them) of every series with a pid label."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)", body, re.M))
    out = set()
    for name, labels, _ in parse(body):
        if "pid" in labels:
            out.add(name.removesuffix("_total") if types.get(name) == "counter" else name)
    return out


# -- the real daemon, counted -------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("scenario", ["large", "mixed", "kubernetes"])
def test_a_host_stays_under_the_series_budget(daemon, scenario):
    d = daemon("--simulate", scenario, config_toml="[nvml]\nfast_interval_seconds = 1.0\n"
               "slow_interval_seconds = 2.0\n")
    # a few ticks, the slow tier and (where there are engines) a scrape of them in
    wait_until(lambda: "gpuwatch_gpu_energy_joules_total" in d.metrics(), 30,
               what="slow-tier series")
    time.sleep(6)
    body = d.metrics()
    series = parse(body)
    n = len(series)
    print(f"{scenario}: {n} series")  # the figure docs/metrics.md quotes
    assert n < BUDGET, Counter(s[0] for s in series).most_common(12)
    worst = max(series, key=lambda s: len(s[1]))
    assert len(worst[1]) <= MAX_LABELS, worst
    # the self-metric counts what was served
    own = [v for name, _, v in series if name == "gpuwatch_exposition_series"]
    assert own == [n]
    folded = sum(v for name, _, v in series if name == "gpuwatch_processes_folded")
    with_own = {lab["pid"] for name, lab, _ in series
                if name == "gpuwatch_process_info"}
    procs = sum(len(g.get("processes", ())) for g in d.state()["sample"]["gpus"])
    if scenario == "large":
        assert folded > 400 and len(with_own) <= 32
    assert abs(folded + len(with_own) - procs) <= 8  # a tick apart, restarts aside


def test_every_per_process_family_is_registered_with_the_fold():
    bodies = [_render(s, 120)[0] for s in ("mixed", "fragmentation", "leak", "kubernetes")]
    found = set().union(*(families_with_pid(b) for b in bodies))
    assert {"gpuwatch_process_gpu_memory_used_bytes", "gpuwatch_process_cpu_seconds",
            "gpuwatch_process_allocator_fragmentation_ratio"} <= found
    assert sorted(found - set(PER_PROCESS)) == [], (
        "per-process families missing from gpuwatch/exporter/fold.py PER_PROCESS: choose "
        "SUM or DROP for each")


# -- the selection --------------------------------------------------------------------------

def _render(scenario: str, seconds: float, budget: BudgetConfig | None = None,
            interval: float = 2.0):
    cfg = load(None, environ={})
    pipeline = Pipeline(cfg, load_table(None))
    if budget is not None:
        pipeline.budget = Budget(budget)
    backend = SimulatedBackend(scenario, interval=interval)
    renderer = Renderer()
    t0 = 1.8e9
    events: list[Event] = []
    bodies = []
    for k in range(int(seconds / interval)):
        t = t0 + interval * k
        tick = Tick(t=t, gpus=backend.sample(t), engines=backend.engines(t),
                    probes=backend.probes(t))
        events += pipeline.update(tick)
        snap = Snapshot(version=k + 1, tick=tick, derived=pipeline.derived, ready=True,
                        started=t0)
        bodies.append(renderer.render(snap).decode())
    return bodies[-1], bodies, events, pipeline


def _proc(pid: int, used_mib: int) -> ProcessSample:
    return ProcessSample(pid=pid, name=f"p{pid}", used_memory_bytes=used_mib << 20,
                         create_time=1.0, cpu_seconds_total=float(pid))


def _tick(t: float, used: dict[int, int], probes=()) -> Tick:
    return Tick(t=t, gpus=[GpuSample(index=0, uuid="GPU-a", memory_total_bytes=80 << 30,
                                     memory_used_bytes=sum(used.values()) << 20,
                                     processes=[_proc(p, m) for p, m in used.items()])],
                probes=[ProbeSample(pid=p, t=t) for p in probes])


def _exported(sel) -> set[int]:
    return {pid for _, pid in sel.exported}


def test_top_k_by_memory_per_gpu_the_rest_folded():
    b = Budget(BudgetConfig(top_k=2, max_processes=10))
    sel = b.update(_tick(0, {1: 100, 2: 300, 3: 200, 4: 50}), Derived(), [], [])
    assert _exported(sel) == {2, 3}
    assert sel.folded == {"GPU-a": 2}


def test_leaving_the_top_k_holds_its_series_then_lets_go():
    """Two processes trading rank K on every tick keep one continuous series each; one that
    stays out loses its series once, after hold_seconds."""
    b = Budget(BudgetConfig(top_k=1, max_processes=10, hold_seconds=60))
    for t in range(0, 50, 2):  # 1 and 2 swap the top place every tick
        big, small = (1, 2) if t % 4 else (2, 1)
        sel = b.update(_tick(t, {big: 500, small: 499, 3: 10}), Derived(), [], [])
        assert _exported(sel) == ({1, 2} if t else {2}), t
    # 2 stays below from t=50: held until 50 + 60 minus a tick, gone after
    gone = []
    for t in range(50, 140, 2):
        sel = b.update(_tick(t, {1: 500, 2: 100, 3: 10}), Derived(), [], [])
        gone.append(2 not in _exported(sel))
    assert gone == sorted(gone) and gone.index(True) * 2 + 50 > 100  # one change, late


def test_what_must_stay_is_never_folded_whatever_the_cap():
    b = Budget(BudgetConfig(top_k=0, max_processes=0))
    d = Derived()
    d.process("GPU-a", 5).leak_severity = 1
    ev = Event(t=0, signal="fragmentation", state="firing", gpu_uuid="GPU-a", pid=6)
    sel = b.update(_tick(0, {5: 10, 6: 10, 7: 10, 8: 10}, probes=[7]), d, [ev], [])
    assert sel.reasons == {("GPU-a", 5): "judged", ("GPU-a", 6): "event",
                           ("GPU-a", 7): "probe"}
    # the verdict back to none: still judged (its series never gaps until it exits)
    d.process("GPU-a", 5).leak_severity = 0
    sel = b.update(_tick(600, {5: 10, 6: 10, 8: 10}), d, [], [])
    assert _exported(sel) == {5, 6}  # the event is recent (an hour), the probe's pid exited
    sel = b.update(_tick(4000, {5: 10, 6: 10, 8: 10}), d, [], [])
    assert _exported(sel) == {5}
    sel = b.update(_tick(4002, {6: 10, 8: 10}), d, [], [])  # 5 exited: forgotten
    sel = b.update(_tick(4004, {5: 10, 6: 10, 8: 10}), Derived(), [], [])
    assert _exported(sel) == set()


def test_the_cap_prefers_qualifying_and_incumbent_processes():
    b = Budget(BudgetConfig(top_k=3, max_processes=3, hold_seconds=100))
    b.update(_tick(0, {1: 900, 2: 800, 3: 700, 4: 100}), Derived(), [], [])
    sel = b.update(_tick(2, {1: 900, 2: 800, 3: 100, 4: 700}), Derived(), [], [])
    assert _exported(sel) == {1, 2, 4}  # 4 qualifies now; 3 only held: the cap drops it
    d = Derived()
    d.process("GPU-a", 9).phase = "loading"
    sel = b.update(_tick(4, {1: 900, 2: 800, 3: 100, 4: 700, 9: 50}), d, [], [])
    assert _exported(sel) == {1, 2, 4}  # not steady qualifies, but the top K came first


def test_disabled_exports_every_process():
    sel = Budget(BudgetConfig(enabled=False)).update(_tick(0, {1: 1, 2: 2}), Derived(), [], [])
    assert sel.exported is None
    body = _render("large", 4, BudgetConfig(enabled=False))[0]
    assert body.count("gpuwatch_process_info{") == 512
    assert "gpuwatch_processes_folded" not in body


# -- the fold ------------------------------------------------------------------------------

def _by(series, name: str, key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for n, labels, v in series:
        if n == name:
            out[labels[key]] = out.get(labels[key], 0.0) + v
    return out


def test_sums_per_gpu_are_the_same_folded_or_not():
    folded = parse(_render("large", 6)[0])
    full = parse(_render("large", 6, BudgetConfig(enabled=False))[0])
    for name in ("gpuwatch_process_gpu_memory_used_bytes",
                 "gpuwatch_process_resident_memory_bytes"):
        a, b = _by(folded, name, "gpu"), _by(full, name, "gpu")
        assert a.keys() == b.keys() and len(a) == 8
        assert all(a[g] == pytest.approx(b[g]) for g in a), name
    rest = [lab for n, lab, _ in folded
            if n == "gpuwatch_process_gpu_memory_used_bytes" and lab["pid"] == ""]
    assert len(rest) == 8 and all(lab["process"] == "" for lab in rest)
    # nothing per process survives for a folded one
    pids = {lab["pid"] for n, lab, _ in folded if n == "gpuwatch_process_info"}
    assert len(pids) <= 32
    assert {lab["pid"] for n, lab, _ in folded if "pid" in lab} - {""} == pids


def test_a_folded_counter_only_grows_while_processes_come_and_go():
    """The group's CPU counter adds what folded processes counted while folded: a process
    moving out of the group (into the top K) or exiting takes nothing back."""
    b = Budget(BudgetConfig(top_k=1, max_processes=5, hold_seconds=0))
    r = Renderer()
    values = []
    used = {1: 500, 2: 400, 3: 300}
    for k in range(12):
        t = float(k)
        if k == 4:
            used = {1: 100, 2: 400, 3: 300}  # 2 takes the top: it leaves the group, 1 joins
        if k == 8:
            used = {2: 400, 3: 300}  # 1 exits
        tick = _tick(t, used)
        for g in tick.gpus:
            for p in g.processes:
                p.cpu_seconds_total = 10.0 * p.pid + 3.0 * k
        d = Derived()
        d.budget = b.update(tick, d, [], [])
        snap = Snapshot(version=k + 1, tick=tick, derived=d, ready=True)
        rest = [v for n, lab, v in parse(r.render(snap).decode())
                if n == "gpuwatch_process_cpu_seconds_total" and lab["pid"] == ""]
        values.append(rest[0])
    assert values == sorted(values)
    # two members for 3 ticks, then one: 3 s per member per tick
    assert values[3] == pytest.approx(2 * 3 * 3.0)
    assert values[-1] > values[3]


def test_verdicts_events_and_alert_series_lose_nothing():
    """leak, with a budget that folds everything it may: the leaking process has its verdict
    series on every render from its first verdict above none until it exits, and the
    events are those of an unbudgeted run."""
    tight = BudgetConfig(top_k=0, max_processes=0)
    _, bodies, events, _ = _render("leak", 240, tight)
    _, _, free_events, _ = _render("leak", 240, BudgetConfig(enabled=False))
    assert events == free_events
    leaks = [e for e in events if e.signal == "memory_leak" and e.pid is not None]
    assert leaks, "the leak scenario's process leaks"
    pid = str(leaks[0].pid)
    present = [any(n == "gpuwatch_process_memory_leak_severity" and lab["pid"] == pid
                   for n, lab, _ in parse(b)) for b in bodies]
    first = present.index(True)
    assert all(present[first:]), "a gap in the judged process's verdict series"
    # the steady server is folded: no series of its own, but summed
    last = parse(bodies[-1])
    assert {lab["pid"] for n, lab, _ in last if n == "gpuwatch_process_info"} == {pid}


def test_a_process_that_died_of_its_oom_keeps_its_oom_series():
    # the OOM alert reads increase() over its counter after the process has gone
    from gpuwatch.signals.derived import OomTally

    b = Budget(BudgetConfig(top_k=0, max_processes=0))
    d = Derived()
    d.ooms[("GPU-a", 9)] = OomTally()
    sel = b.update(_tick(0, {5: 10}), d, [], [])  # 9 is no longer on the GPU
    assert sel.reasons == {("GPU-a", 9): "oom"}
    del d.ooms[("GPU-a", 9)]  # the tally expired: the series with it
    assert _exported(b.update(_tick(2, {5: 10}), d, [], [])) == set()
