"""Memory and engine signal guards an operator relies on, through the analyzers as the daemon
runs them: a reload ends a leak episode at once; time to OOM runs at the rate the leak was
judged on; an engine's sleep and wake are held, whether NVML gives per-process figures or
not; a KV cache larger than the GPU is no pool; a queue-time histogram that cannot be
believed is not replaced by the mean."""

from __future__ import annotations

import math

import pytest

from gpuwatch.config import Config, load
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.config import QueueSignalConfig
from gpuwatch.signals.derived import Derived, EngineState
from gpuwatch.signals.memory import MemoryAnalyzer
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.thresholds import load_table
from tests.test_engine_analyzer import Run, config
from tests.test_leak import A100, CRIT, GIB, MIB, T0, gpu_tick

TOTAL = A100[1]


def test_a_reload_ends_a_firing_leak_episode_at_once():
    """A process leaks at 64 MiB/s (critical), then gives its memory back and loads again:
    the episode ends on the tick of the reload, not after the critical exit window."""
    onset, reload_at = 60.0, 240.0

    def memory(el: float) -> float:
        if el >= reload_at:
            return 2 * GIB  # released: far below half of what it held steadily
        return 20 * GIB + 64 * MIB * max(0.0, el - onset)
    pipeline = Pipeline(Config(), load_table())
    events = []
    for i in range(int(300 / 3)):
        el = i * 3.0
        for e in pipeline.update(gpu_tick(T0 + el, [(11, memory(el), T0 - 3600)])):
            if e.signal == "memory_leak" and e.pid == 11:
                events.append((e.state, e.severity, e.t - T0))
    assert [s for s, _, _ in events] == ["firing", "resolved"], events
    assert events[0][1] == "critical" and events[0][2] < reload_at
    assert events[1][2] == reload_at


def test_time_to_oom_runs_at_the_judged_rate_while_a_leak_is_held():
    """A critical leak that stops: the episode is held while its exit window runs, and the
    time to OOM keeps the rate it was judged on (noise in the current estimate may only
    shorten it), so it does not swing to infinity and back within one episode."""
    onset, stop = 60.0, 180.0
    table = load_table()
    pipeline = Pipeline(Config(), table)
    held = []
    for i in range(int(360 / 3)):
        el = i * 3.0
        used = 20 * GIB + 64 * MIB * (min(el, stop) - onset if el > onset else 0.0)
        pipeline.update(gpu_tick(T0 + el, [(11, used, T0 - 3600)]))
        firing = pipeline.derived.processes[("GPU-0", 11)].leak_severity
        sig = pipeline.derived.gpus["GPU-0"]
        if el > stop + 30 and firing:
            headroom = table.match(*A100).budget_bytes - (used + 500 * MIB)
            held.append((el, sig.time_to_oom_seconds, headroom))
    assert held, "the episode was not held past the stop"
    for el, ttoom, headroom in held:
        # judged at no less than the entry level of the critical slope
        assert ttoom <= headroom / (0.9 * CRIT) + 1.0, (el, ttoom)


def _memory(zone=None) -> tuple[MemoryAnalyzer, Derived, Conditions]:
    cfg = load(None, environ={}, overrides={"signals": {"zone": zone}} if zone else None)
    return MemoryAnalyzer(cfg, load_table()), Derived(), Conditions()


ENGINE_CORE, OTHER = 11, 20
AWAKE, ASLEEP = 72 * GIB, 900 * MIB


def sleeping_vllm(t: float, asleep: float = ASLEEP) -> tuple[float, int]:
    """(what the engine core holds, its sleep level): awake 20 min, asleep 10, then it takes
    its memory back over 40 s."""
    phase = t % 1800
    if phase < 1200:
        return AWAKE, 0
    if phase < 1800 - 40:
        return asleep, 1
    return asleep + (phase - 1760) / 40 * (AWAKE - asleep), 0


FIGURES = pytest.mark.parametrize("per_process", [True, False],
                                  ids=["per-process figures", "no per-process figures"])


def _tick(t: float, procs: list[tuple[int, float]], per_process: bool,
          used: float | None = None) -> Tick:
    ps = [ProcessSample(pid=pid, name="vllm" if pid == ENGINE_CORE else "python3",
                        create_time=T0 - 7200,
                        used_memory_bytes=int(held) if per_process else None)
          for pid, held in procs]
    used = sum(h for _, h in procs) + 500 * MIB if used is None else used
    return Tick(t=t, gpus=[GpuSample(index=0, uuid="GPU-0", name=A100[0],
                                     memory_total_bytes=TOTAL, memory_used_bytes=int(used),
                                     processes=ps)])


def _sleep_and_wake_twice(per_process: bool, asleep: float) -> list:
    """The leak events of a vLLM engine with a fixed 20 GiB KV cache that sleeps twice."""
    analyzer, derived, cond = _memory()
    leaks, woke = [], 0
    for k in range(int(2 * 1800 / 3)):
        t = T0 + 3 * k
        held, level = sleeping_vllm(3 * k, asleep)
        prev = derived.engines.get("vllm-0")
        changed = prev.sleep_changed_at if prev else None
        if prev is not None and (prev.sleep_level or 0) != level:
            changed, woke = t, woke + (level == 0)
        derived.engines = {"vllm-0": EngineState(
            name="vllm-0", kind="vllm", up=True, pids=[ENGINE_CORE], sleep_level=level,
            sleep_changed_at=changed, kv_pool_bytes=20 * GIB)}
        tick = _tick(t, [(ENGINE_CORE, held)], per_process)
        leaks += [e for e in analyzer.update(tick, derived, cond) if e.signal == "memory_leak"]
    assert woke == 2
    return leaks


@FIGURES
def test_sleep_and_wake_of_an_engine_with_a_small_fixed_kv_cache_raise_no_leak(per_process):
    """A fixed 20 GiB KV cache plans far less than the engine holds awake (the weights come
    on top): asleep it falls below half of that, which unheld is a reload, and its wake-up a
    fast climb. The sleep state holds the series: the process's, or the GPU's own where
    NVML gives no per-process figures (containers, some drivers)."""
    assert _sleep_and_wake_twice(per_process, ASLEEP) == []


@FIGURES
def test_an_engine_that_sleeps_with_its_weights_kept_raises_no_leak_on_waking(per_process):
    """Asleep it gives back only its KV cache (72 -> 52 GiB: above half, so no reload), and
    waking takes the 20 GiB back in 40 s, a climb of 500 MiB/s on a steady series. Only
    the sleep state holds it; unheld, each wake-up is a critical leak."""
    assert _sleep_and_wake_twice(per_process, AWAKE - 20 * GIB) == []


def _bogus_kv_engine() -> dict:
    """An engine that says its KV cache is twice the GPU; its published share is 0.05."""
    return {"vllm-0": EngineState(name="vllm-0", kind="vllm", up=True, pids=[ENGINE_CORE],
                                  kv_pool_bytes=2 * TOTAL,
                                  cache_config={"gpu_memory_utilization": "0.05"})}


@FIGURES
def test_a_kv_cache_larger_than_the_gpu_hides_no_full_gpu(per_process):
    """The share is the pool instead, so a process beside the engine that fills the GPU
    still turns the zone red. (With per-process figures the zone also never plans more
    than the engine holds; without them the pool is all it has.)"""
    analyzer, derived, cond = _memory()
    derived.engines = _bogus_kv_engine()
    events = []
    for k in range(20):
        tick = _tick(T0 + 3 * k, [(ENGINE_CORE, 4 * GIB), (OTHER, 75 * GIB)], per_process,
                     used=79.5 * GIB)
        events += analyzer.update(tick, derived, cond)
    sig = derived.gpus["GPU-0"]
    assert sig.unplanned_memory_bytes == pytest.approx(79.5 * GIB - 0.05 * TOTAL, rel=1e-6)
    assert sig.zone == 2
    assert ("memory_zone", "critical") in [(e.signal, e.severity) for e in events]


def test_a_kv_cache_larger_than_the_gpu_hides_no_leak_of_the_engine():
    """Growing up to its pool is planned for the engine's process; a pool larger than the
    GPU would make every leak of it planned."""
    analyzer, derived, cond = _memory()
    derived.engines = _bogus_kv_engine()
    leaks = []
    for k in range(100):
        held = 30 * GIB + 64 * MIB * max(0.0, 3 * k - 60)
        leaks += [e for e in analyzer.update(_tick(T0 + 3 * k, [(ENGINE_CORE, held)], True),
                                             derived, cond) if e.signal == "memory_leak"]
    assert [(e.pid, e.severity) for e in leaks][:1] == [(ENGINE_CORE, "critical")]


def _insane_histogram(n: int, qsum: float) -> str:
    """A vLLM queue-time histogram whose only finite bound is two days: its p99 cannot be
    believed. Its sum and count give a mean of qsum / n."""
    lab = 'engine="0",model_name="m"'
    lines = ["process_start_time_seconds 1000",
             f"vllm:num_requests_running{{{lab}}} 0", f"vllm:num_requests_waiting{{{lab}}} 0"]
    lines += [f'vllm:request_queue_time_seconds_bucket{{{lab},le="{b}"}} {c}'
              for b, c in ((172800.0, n), ("+Inf", n))]
    lines += [f"vllm:request_queue_time_seconds_count{{{lab}}} {n}",
              f"vllm:request_queue_time_seconds_sum{{{lab}}} {qsum}"]
    return "\n".join(lines) + "\n"


def test_a_histogram_that_cannot_be_believed_is_not_replaced_by_the_mean():
    """The engine has a queue-time histogram, so its quantile is what is judged; where that
    quantile is refused (absurd bounds), the mean of the same requests is no stand-in."""
    run = Run(config(queue=QueueSignalConfig(quantiles=[0.99], slo_quantile=0.99,
                                             slo_seconds=1.0, min_requests=1)))
    run.scrape(0.0, _insane_histogram(0, 0.0))
    run.scrape(10.0, _insane_histogram(100, 500.0))
    st = run.state()
    assert st.queue_latency_seconds == {} and st.queue_latency_mean_seconds == 5.0
    assert "bucket bounds are not sane" in st.missing["queue_latency"]
    assert [e for e in run.events if e.signal == "queue_latency"] == []
    assert math.isfinite(st.queue_latency_mean_seconds)


def test_an_analyzer_that_fails_costs_its_tick_and_raises_where_figures_are_measured():
    """The daemon keeps going past one analyzer's bug (counted, logged); a benchmark or a
    replay that measures figures runs strict, so a bug cannot pass for a detector that
    found nothing."""

    class Failing:
        def update(self, tick, derived, conditions):
            raise ValueError("analyzer bug")

    tick = gpu_tick(T0, [(11, 20 * GIB, T0 - 3600)])
    daemon = Pipeline(Config(), load_table())
    daemon.analyzers.insert(0, Failing())
    daemon.update(tick)
    assert daemon.errors == 1
    assert ("GPU-0", 11) in daemon.derived.processes  # the memory analyzer still ran
    strict = Pipeline(Config(), load_table(), strict=True)
    strict.analyzers.insert(0, Failing())
    with pytest.raises(ValueError, match="analyzer bug"):
        strict.update(tick)
