"""Memory facts from engines: the planned pool and sleep mode, read from real expositions,
feed the zone, the leak series and the time to OOM; sleep and wake are neither a leak nor a
fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuwatch.config import load
from gpuwatch.exposition import read
from gpuwatch.model import EngineSample, GpuSample, ProcessSample, Tick
from gpuwatch.recording import Recorder
from gpuwatch.replay import iter_events
from gpuwatch.signals.derived import EngineState
from gpuwatch.signals.pools import engine_pools

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
MIB, GIB = 1 << 20, 1 << 30
TOTAL = 80 * GIB  # A100-SXM4-80GB: a calibrated row
REAL = "vllm-0.32.0-cpu-real-load.prom"


def real(name: str = REAL) -> str:
    return (FIXTURES / name).read_text()


def asleep(text: str, level: int) -> str:
    """The real capture as vLLM writes it while asleep at `level` (1 or 2)."""
    states = {"awake": 0.0, "weights_offloaded": float(level == 1),
              "discard_all": float(level == 2)}

    def put(m: re.Match) -> str:
        return f'{m.group(1)}sleep_state="{m.group(2)}"}} {states[m.group(2)]}'

    out, n = re.subn(r'(vllm:engine_sleep_state\{[^}]*)sleep_state="(\w+)"\} \S+', put, text)
    assert n == 3
    return out


def without_kv_bytes(text: str) -> str:
    """What 0.32 writes on a GPU, where vLLM sizes the KV cache itself from the share."""
    return text.replace('kv_cache_memory_bytes="1073741824"', 'kv_cache_memory_bytes="None"')


# -- reading ----------------------------------------------------------------------------------

def test_vllm_0_32_memory_facts_from_the_real_capture():
    r, why = read(real())
    assert why == ""
    assert r.sleep_level == 0
    assert r.kv_pool_tokens == 16 * 128  # num_gpu_blocks x block_size
    # VLLM_CPU_KVCACHE_SPACE=1 gave it 1 GiB, but --num-gpu-blocks-override 16 made the pool
    # 16 blocks: the bytes are not the pool's size
    assert r.kv_pool_bytes is None and "num_gpu_blocks_override" in " ".join(r.notes)
    fixed, _ = read(real().replace('_override="16"', '_override="None"'))
    assert fixed.kv_pool_bytes == 1 << 30
    # 37 labels, 32 kept: the ones the memory model reads are never the ones cut
    for key in ("gpu_memory_utilization", "num_gpu_blocks", "block_size",
                "kv_cache_memory_bytes", "enable_prefix_caching"):
        assert key in r.cache_config
    assert "vllm:engine_sleep_state" not in r.unread_families


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_levels(level):
    r, _ = read(asleep(real(), level))
    assert r.sleep_level == level


def test_older_vllm_has_no_sleep_state_and_an_unset_kv_size_is_unknown():
    r, _ = read(without_kv_bytes(real("vllm-0.8-v1-dp2.prom")))
    assert r.sleep_level is None and r.kv_pool_bytes is None
    assert r.kv_pool_tokens == 224000  # still its blocks x block size
    r, _ = read(without_kv_bytes(real()))
    assert r.kv_pool_bytes is None


def test_sglang_kv_pool_in_tokens():
    # sglang:max_total_num_tokens, "Maximum total number of tokens in the KV cache pool"
    # (python/sglang/srt/metrics/collector.py), duplicated per tensor-parallel worker
    r, _ = read(real("sglang.prom"))
    assert r.kv_pool_tokens == 161721
    assert r.sleep_level is None


# -- the pool on a GPU ----------------------------------------------------------------------

def gpu(used: float, procs) -> GpuSample:
    return GpuSample(index=0, uuid="GPU-0", name="NVIDIA A100-SXM4-80GB",
                     memory_total_bytes=TOTAL, memory_used_bytes=int(used),
                     processes=[ProcessSample(pid=pid, name="python3", create_time=1.0,
                                              used_memory_bytes=None if u is None else int(u))
                                for pid, u in procs])


def engine(**kw) -> EngineState:
    kw.setdefault("cache_config", {"gpu_memory_utilization": "0.9"})
    return EngineState(name="vllm-0", kind="vllm", up=True, pids=[10, 11], **kw)


def test_the_largest_holder_carries_the_pool_and_the_rest_is_ahead():
    (e,) = engine_pools(gpu(20 * GIB, [(10, 1 * GIB), (11, 18 * GIB)]),
                        {"vllm-0": engine()}, 0.9)
    assert e.pool == pytest.approx(0.9 * TOTAL)
    assert e.floors == {11: pytest.approx(0.9 * TOTAL - GIB)}  # the engine core, not the API
    assert e.ahead == pytest.approx(0.9 * TOTAL - 19 * GIB)  # still to be taken
    assert e.quiet == ""
    # a fixed KV size replaces the share, as it does in vLLM
    (e,) = engine_pools(gpu(20 * GIB, [(11, 18 * GIB)]),
                        {"vllm-0": engine(kv_pool_bytes=8 * GIB)}, 0.9)
    assert e.pool == 8 * GIB and e.ahead == 0


def test_asleep_and_settling_engines_are_quiet():
    g = gpu(2 * GIB, [(11, 1 * GIB)])
    assert engine_pools(g, {"x": engine(sleep_level=1)}, 0.9, t=100, settle=60)[0].quiet
    woke = engine(sleep_level=0, sleep_changed_at=100.0)
    assert engine_pools(g, {"x": woke}, 0.9, t=159, settle=60)[0].quiet
    assert engine_pools(g, {"x": woke}, 0.9, t=160, settle=60)[0].quiet == ""


# -- a replayed trace: vLLM sleeps and wakes ------------------------------------------------

POOL = 0.92 * TOTAL  # the real capture's gpu_memory_utilization
AWAKE_USED = POOL - 600 * MIB  # NVML's figure of a healthy vLLM sits just under its share
ASLEEP_USED = 900 * MIB  # the CUDA context stays


def sleepy_used(t: float, leak: float = 0.0) -> tuple[float, int]:
    """(NVML used of the engine core, its sleep level) at t: asleep for 10 min of every 40,
    taking memory back over 40 s on waking (weights come back from the CPU)."""
    phase = t % 2400
    extra = leak * t
    if phase < 1800:
        return AWAKE_USED + extra, 0
    if phase < 2400 - 40:
        return ASLEEP_USED, 1
    ramp = (phase - (2400 - 40)) / 40
    # a staged wake-up (weights, then the KV cache) reports awake before all is back
    return ASLEEP_USED + ramp * (AWAKE_USED + extra - ASLEEP_USED), int(ramp < 0.5)


def no_sleep_state(text: str) -> str:
    """vLLM before sleep mode had a metric: only the pool tells sleep from a leak."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if "engine_sleep_state" not in line)


# (what the engine publishes, which fact must carry the judgement)
CASES = {
    # the share: the pool floor holds the series flat through sleep and wake
    "share-without-sleep-state": lambda text: no_sleep_state(without_kv_bytes(text)),
    # a KV size fixed at 50 GiB plans less than the process holds (weights come on top):
    # the sleep state must hold the series
    "fixed-kv-with-sleep-state": lambda text: text.replace(
        'kv_cache_memory_bytes="1073741824"', f'kv_cache_memory_bytes="{50 * GIB}"'),
}


def record(path: Path, seconds: float, publish, leak: float = 0.0) -> Path:
    text = publish(real())
    rec = Recorder(str(path), host="h", interval_s=3)
    t0 = 1.8e9
    level_seen = 0
    for k in range(int(seconds / 3)):
        t = k * 3.0
        used, level = sleepy_used(t, leak)
        engines = []
        if k % 2 == 0:  # scraped every 6 s, reporting the state it had at the last tick
            expo = asleep(text, level_seen) if level_seen and "sleep_state" in text else text
            engines = [EngineSample(name="vllm-0", kind="vllm", url="http://x/metrics",
                                    exposition=expo, t=t0 + t, pids=[10, 11])]
        level_seen = level
        rec.write(Tick(t=t0 + t, gpus=[gpu(used + 200 * MIB + 300 * MIB,
                                           [(10, 300 * MIB), (11, used)])],
                       engines=engines))
    rec.close()
    return path


def memory_events(path: Path, **zone) -> list:
    cfg = load(None, environ={},
               overrides={"signals": {"zone": zone}} if zone else None)
    return [e for e in iter_events(str(path), cfg, actions=False)
            if getattr(e, "signal", "") in ("memory_leak", "time_to_oom", "memory_zone")
            and e.state == "firing"]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_sleep_and_wake_are_not_a_leak(tmp_path, case):
    path = record(tmp_path / "sleepy.jsonl", 4 * 3600, CASES[case])
    # without the engine's facts the same recording alarms: the pool counts against the zone
    # (the leak detector alone takes the wake-ups for loads, in steps, and pauses)
    blind = memory_events(path, planned_pools=False)
    assert any(e.signal in ("memory_leak", "memory_zone") for e in blind), blind
    assert memory_events(path) == []


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_leak_beyond_the_pool_is_still_found_across_sleeps(tmp_path, case):
    path = record(tmp_path / "leaky.jsonl", 4 * 3600, CASES[case], leak=40 * MIB / 60)
    leaks = [e for e in memory_events(path) if e.signal == "memory_leak"]
    assert leaks and {e.pid for e in leaks} == {11}


def test_time_to_oom_counts_a_sleeping_engines_pool_as_spent():
    """Another process leaks next to a vLLM asleep: when it wakes it takes its pool back, so
    the budget runs out that much sooner."""
    from gpuwatch.signals.conditions import Conditions
    from gpuwatch.signals.derived import Derived
    from gpuwatch.signals.memory import MemoryAnalyzer
    from gpuwatch.thresholds import load_table

    def run(planned: bool):
        cfg = load(None, environ={},
                   overrides={"signals": {"zone": {"planned_pools": planned}}})
        analyzer, derived, cond = MemoryAnalyzer(cfg, load_table()), Derived(), Conditions()
        derived.engines = {"vllm-0": EngineState(name="vllm-0", kind="vllm", up=True,
                                                 pids=[11], sleep_level=1)}
        for k in range(60):
            leaker = 4 * GIB + k * 3 * 60 * MIB  # 60 MiB/s: critical
            analyzer.update(Tick(t=1.8e9 + 3 * k, gpus=[gpu(
                leaker + GIB + 500 * MIB, [(11, GIB), (20, leaker)])]), derived, cond)
        sig = derived.gpus["GPU-0"]
        return sig.time_to_oom_seconds, sig.leak_rate_bytes_per_second

    (blind, rate), (knowing, rate2) = run(False), run(True)
    assert rate == rate2 > 50 * MIB
    ahead = 0.9 * TOTAL - GIB  # the pool it will take back
    assert knowing == pytest.approx(max(0.0, blind - ahead / rate), abs=1.0)
    assert knowing < blind
