"""vLLM-style sleep and wake on a real GPU: a torch process holds a pool, releases it
(`empty_cache`, as vLLM's sleep does) and takes it back in chunks (as wake_up reloads the
weights), three times. NVML is real; the engine's exposition is the real vLLM 0.32 capture
with the sleep state the process is in, as vLLM would report it one scrape later (vLLM itself
is not installed on the GPU host). Neither the pool floor nor the sleep hold may let a
leak or time-to-OOM event fire; the same ticks without the engine's facts are reported for
comparison. Skipped without torch and CUDA."""

from __future__ import annotations

import importlib.util
import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpuwatch.config import load
from gpuwatch.model import EngineSample, Tick
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.thresholds import load_table

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(570)]

if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed", allow_module_level=True)

GIB = 1 << 30
POOL_GIB = 20
# sleep/wake cycles, 130 s each (fewer where GPU time is short)
CYCLES = int(os.environ.get("GPUWATCH_TEST_SLEEP_CYCLES", "3"))
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"

# Prints "ready", then "sleep <t>" / "wake <t>" / "awake <t>" as it moves; holds until killed.
CHILD = textwrap.dedent("""
    import sys, time
    import torch
    if not torch.cuda.is_available():
        print("nocuda", flush=True); sys.exit(0)
    gib, cycles = int(sys.argv[1]), int(sys.argv[2])
    def load():
        return [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(gib)]
    pool = load()
    torch.cuda.synchronize()
    print("ready", flush=True)
    for _ in range(cycles):
        time.sleep(90)  # longer than the 60 s the series hold after a wake
        print("sleep", time.time(), flush=True)
        del pool
        torch.cuda.empty_cache()
        time.sleep(30)
        print("wake", time.time(), flush=True)
        pool = []
        for _ in range(gib):  # weights come back from the CPU over ~10 s
            pool.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
            time.sleep(10 / gib)
        torch.cuda.synchronize()
        print("awake", time.time(), flush=True)
    time.sleep(3600)
""")

CONFIG = {"signals": {"leak": {
    "lifecycle": {"loading_settle_seconds": 5, "warmup_settle_seconds": 10},
}}}


def expositions(share: float) -> dict[str, tuple[str, str]]:
    """(awake, asleep) texts per case: the pool share without a sleep state, or the sleep
    state with a fixed KV size too small to cover the process."""
    real = (FIXTURES / "vllm-0.32.0-cpu-real-load.prom").read_text()
    real = real.replace('gpu_memory_utilization="0.92"', f'gpu_memory_utilization="{share:.4f}"')
    asleep = (real.replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0')
              .replace('sleep_state="weights_offloaded"} 0.0',
                       'sleep_state="weights_offloaded"} 1.0'))
    share_only = real.replace('kv_cache_memory_bytes="1073741824"', 'kv_cache_memory_bytes="None"')
    share_only = "".join(x for x in share_only.splitlines(keepends=True)
                         if "engine_sleep_state" not in x)
    return {"share": (share_only, share_only), "sleep-state": (real, asleep)}


def test_sleep_and_wake_on_a_gpu_are_not_a_leak():
    from gpuwatch.sources.nvml import NvmlBackend

    backend = NvmlBackend()
    backend.open()
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(POOL_GIB), str(CYCLES)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().strip()
        if line == "nocuda":
            pytest.skip("torch has no CUDA here")
        assert line == "ready", line
        gpus = backend.sample(time.time())
        mine = [g for g in gpus if child.pid in {p.pid for p in g.processes}]
        if not mine:
            pytest.skip("NVML reports other pids than ours (a PID namespace)")
        held = next(p.used_memory_bytes for p in mine[0].processes if p.pid == child.pid)
        share = min(0.99, (held + GIB) / mine[0].memory_total_bytes)
        texts = expositions(share)
        runs = {case: Pipeline(load(None, environ={}, overrides=CONFIG), load_table())
                for case in texts}
        blind_cfg = {"signals": {**CONFIG["signals"], "zone": {"planned_pools": False}}}
        blind = Pipeline(load(None, environ={}, overrides=blind_cfg), load_table())
        events: dict[str, list] = {case: [] for case in [*texts, "blind"]}
        state, reported, phases, k = "awake", "awake", [], 0
        deadline = time.time() + CYCLES * 130 + 90
        last_awake = None
        # until 75 s after the last wake-up: the series are judged again after it
        while time.time() < deadline and (last_awake is None or len(phases) < 3 * CYCLES
                                          or time.time() < last_awake + 75):
            now = time.time()
            if select.select([child.stdout], [], [], 0)[0]:
                what = child.stdout.readline().split()[0]
                phases.append(what)
                state = "awake" if what == "awake" else "asleep"
                last_awake = now if what == "awake" else last_awake
            gpus = backend.sample(now)
            for case, (awake_text, asleep_text) in texts.items():
                text = awake_text if reported == "awake" else asleep_text
                sample = EngineSample(name="vllm-0", kind="vllm", exposition=text, t=now,
                                      pids=[child.pid]) if k % 2 == 0 else None
                tick = Tick(t=now, gpus=gpus, engines=[sample] if sample else [])
                events[case] += runs[case].update(tick)
            events["blind"] += blind.update(Tick(t=now, gpus=gpus))
            if k % 2 == 0:
                reported = state  # the engine says what it was at its last scrape
            k += 1
            time.sleep(max(0.0, 1.0 - (time.time() - now)))
        assert phases == ["sleep", "wake", "awake"] * CYCLES, phases
        alarms = {case: [e for e in evs if getattr(e, "signal", "") in
                         ("memory_leak", "time_to_oom") and e.state == "firing"]
                  for case, evs in events.items()}
        print("without the engine's facts:", [(e.signal, e.severity, e.pid, e.value)
                                               for e in alarms["blind"]])
        assert alarms["share"] == [] and alarms["sleep-state"] == [], alarms
    finally:
        child.kill()
        child.wait(timeout=30)
        backend.close()
