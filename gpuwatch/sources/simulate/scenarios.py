"""The simulated hosts `--simulate SCENARIO` offers."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from gpuwatch.sources.simulate.kubernetes import Placement
from gpuwatch.sources.simulate.trajectory import GIB, MIB, ProcessSpec


class GpuModel(NamedTuple):
    """A model as NVML reports it: name, total memory, the default power limit, what it
    draws idle, whether it has fans (SXM and passively cooled boards report none) and
    HBM (whose temperature NVML reads; GDDR boards report none)."""

    name: str
    total_bytes: int
    power_limit_watts: float
    idle_watts: float
    fans: bool = False
    hbm: bool = True


A100_80 = GpuModel("NVIDIA A100-SXM4-80GB", 81920 * MIB, 400.0, 60.0)
H100_80 = GpuModel("NVIDIA H100 80GB HBM3", 81559 * MIB, 700.0, 70.0)
L40S = GpuModel("NVIDIA L40S", 46068 * MIB, 350.0, 35.0, hbm=False)
RTX4090 = GpuModel("NVIDIA GeForce RTX 4090", 24564 * MIB, 450.0, 25.0, fans=True, hbm=False)
H200 = GpuModel("NVIDIA H200", 143771 * MIB, 700.0, 75.0)


@dataclass(frozen=True)
class GpuSpec:
    model: GpuModel
    processes: tuple[ProcessSpec, ...] = ()
    # Driver-reserved memory (memory-info v2 `reserved`), not counted in `used`.
    reserved_bytes: int = 512 * MIB


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    gpus: tuple[GpuSpec, ...]
    engines_every_seconds: float = 5.0
    extra: dict = field(default_factory=dict)


# Most processes were already serving when the daemon started (an hour and more before,
# past warm-up); a scenario that shows a life cycle starts one at a positive time.
ALREADY_RUNNING = -3600.0


def _server(slot: int, weights_gb: float, **kw) -> ProcessSpec:
    kw.setdefault("start_seconds", ALREADY_RUNNING - 60.0 * slot)
    return ProcessSpec(slot=slot, name=kw.pop("name", "python3"),
                       weights_bytes=weights_gb * GIB, **kw)


def _vllm(slot: int, total: int, utilization: float = 0.9, **kw) -> ProcessSpec:
    """vLLM pre-allocates its KV pool up to gpu_memory_utilization: high and flat."""
    kw.setdefault("start_seconds", ALREADY_RUNNING)
    return ProcessSpec(
        slot=slot, name="vllm", weights_bytes=total * utilization - 1.5 * GIB,
        steady_extra_bytes=1.0 * GIB, warmup_peak_bytes=0.5 * GIB,
        sawtooth_bytes=0.0, noise_bytes=1 * MIB, engine=kw.pop("engine", "vllm-sim-0"), **kw,
    )


def steady() -> Scenario:
    return Scenario(
        "steady", "two A100-80GB serving steadily (allocator sawtooth, transients); a new "
        "replica starts after 30 s: loading, warm-up peak, plateau",
        (
            GpuSpec(A100_80, (_server(0, 30, transient_bytes=600 * MIB),)),
            GpuSpec(A100_80, (_server(1, 24), _server(2, 8, name="embedder", start_seconds=30.0,
                                                       load_seconds=20.0, warmup_seconds=40.0))),
        ),
    )


# The demo leak: clearly above the table's critical slope (50 MiB/s), so that the verdict
# is never a matter of tolerance.
DEMO_LEAK = 64 * MIB


def _leaky_gpu(**leak) -> GpuSpec:
    """One A100-80GB: a steady server, and a worker (serving for an hour) that leaks from
    about 20 s after the daemon started."""
    return GpuSpec(A100_80, (
        _server(0, 12),
        _server(1, 10, name="leaky-worker", leak_bytes_per_second=DEMO_LEAK,
                start_seconds=ALREADY_RUNNING, leak_after_seconds=-ALREADY_RUNNING + 20, **leak),
    ))


def leak() -> Scenario:
    return Scenario(
        "leak", "one A100-80GB; one process leaks 64 MiB/s from about 20 s after start, "
        "until it runs out of memory (about 15 min) and restarts",
        (_leaky_gpu(),),
    )


def leak_fixed() -> Scenario:
    return Scenario(
        "leak-fixed", "like leak, but the leak stops after 3 minutes (12 GiB kept): one "
        "episode that fires, then resolves once",
        (_leaky_gpu(leak_seconds=180.0),),
    )


def leak_early() -> Scenario:
    return Scenario(
        "leak-early", "one A100-80GB; a process starts 30 s in, loads in bursts, warms up, "
        "and leaks 64 MiB/s from its 150th second (before it would count as steady)",
        (GpuSpec(A100_80, (
            _server(0, 12),
            _server(1, 8, name="early-leaker", start_seconds=30.0, load_seconds=24.0,
                    load_bursts=6, warmup_seconds=30.0, leak_bytes_per_second=DEMO_LEAK,
                    leak_after_seconds=150.0),
        )),),
    )


def leak_start() -> Scenario:
    return Scenario(
        "leak-start", "one A100-80GB; a process starts 20 s in, loads 6 GiB in bursts and "
        "leaks 10 MiB/s from its 20th second (with its process: no pause after loading) "
        "for 9 min, then holds what it leaked: one episode that fires, then resolves once",
        (GpuSpec(A100_80, (
            _server(0, 12),
            _server(1, 6, name="fresh-leaker", start_seconds=20.0, load_seconds=15.0,
                    load_bursts=12, warmup_seconds=5.0, warmup_peak_bytes=0.0,
                    leak_bytes_per_second=10 * MIB, leak_after_seconds=20.0,
                    leak_seconds=540.0),
        )),),
    )


def fill() -> Scenario:
    """Four servers that were running already grow together: no one of them is judged
    leaking for a long while (first seen, each is watched a floor window first), but the
    GPU's own retained memory reaches its budget in under 30 min."""
    grow = {"leak_bytes_per_second": 6 * MIB, "start_seconds": ALREADY_RUNNING,
            "leak_after_seconds": -ALREADY_RUNNING + 30}
    return Scenario(
        "fill", "one A100-80GB; four servers (11 GiB each) grow 6 MiB/s each from 30 s: the "
        "GPU's own time to OOM fires from its memory, before any one process is judged",
        (GpuSpec(A100_80, tuple(_server(i, 11, name=f"grower-{i}", **grow)
                                for i in range(4))),),
    )


def fragmentation() -> Scenario:
    return Scenario(
        "fragmentation", "one A100-80GB; a PyTorch process whose allocator fragments (probe)",
        (
            GpuSpec(A100_80, (
                _server(0, 30, name="trainer", probe="fragmenting", sawtooth_bytes=0.0),
                _server(1, 12, probe="healthy"),
            )),
        ),
    )


def mixed() -> Scenario:
    return Scenario(
        "mixed",
        "4 GPUs of different models, several processes each, a vLLM engine, one slow leak",
        (
            GpuSpec(A100_80, (
                _server(0, 40, probe="healthy", transient_bytes=800 * MIB),
                _server(1, 14, name="reranker"),
            )),
            GpuSpec(H100_80, (_vllm(2, H100_80[1]),)),
            GpuSpec(L40S, (
                _server(3, 16, name="embedder"),
                # 30 MIB/min: a slow leak (above the table's 12 MIB/min warning slope)
                _server(4, 6, name="tokenizer-svc", leak_bytes_per_second=0.5 * MIB,
                        start_seconds=ALREADY_RUNNING,
                        leak_after_seconds=-ALREADY_RUNNING + 30, probe="fragmenting"),
                _server(5, 4, name="asr"),
            )),
            # below the 4090's warning zone (17500 MiB): nothing here is under pressure
            GpuSpec(RTX4090, (_server(6, 9), _server(7, 3, name="tts"))),
        ),
    )


def kubernetes() -> Scenario:
    """Pods of two namespaces on three A100s: a two-GPU pod (with a sidecar), a pod that
    shares the second GPU with it (time-slicing), and a pod that leaks."""
    llama = Placement("serving", "llama-70b-7c9f", "vllm", sidecars=("metrics-proxy",))
    return Scenario(
        "kubernetes", "a Kubernetes node: pods in two namespaces on 3 A100-80GB, one GPU "
        "shared by two pods, one leaking pod (cgroups and pod-resources simulated)",
        (
            GpuSpec(A100_80, (_server(0, 30, name="vllm"),)),
            GpuSpec(A100_80, (_server(1, 30, name="vllm"), _server(2, 8, name="embedder"))),
            GpuSpec(A100_80, (
                _server(3, 10, name="tokenizer-svc", leak_bytes_per_second=DEMO_LEAK,
                        start_seconds=ALREADY_RUNNING, leak_after_seconds=-ALREADY_RUNNING + 20),
            )),
        ),
        extra={"pods": {
            0: llama, 1: llama,
            2: Placement("research", "embedder-5d8f9", "embed", qos="burstable"),
            3: Placement("research", "tokenizer-6b7d4", "worker", qos="besteffort"),
        }},
    )


def large() -> Scenario:
    """8 GPUs x 64 processes: the /metrics latency benchmark's host."""
    rng = random.Random(8)
    gpus = []
    for g in range(8):
        procs = tuple(
            _server(g * 64 + i, rng.uniform(0.5, 1.6), steady_extra_bytes=0.2 * GIB,
                    warmup_peak_bytes=0.3 * GIB, sawtooth_bytes=32 * MIB)
            for i in range(64)
        )
        gpus.append(GpuSpec(H200, procs))
    return Scenario("large", "8 H200 x 64 processes each (benchmark host)", tuple(gpus))


SCENARIOS = {f.__name__.replace("_", "-"): f
             for f in (steady, leak, leak_fixed, leak_early, leak_start, fill, fragmentation,
                       mixed, large, kubernetes)}


def get(name: str) -> Scenario:
    try:
        scenario = SCENARIOS[name]()
    except KeyError:
        raise ValueError(
            f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}"
        ) from None
    # A process OOMs when the GPU has no room left for it.
    gpus = []
    for gpu in scenario.gpus:
        total = gpu.model[1] - gpu.reserved_bytes
        others = sum(p.weights_bytes + p.steady_extra_bytes for p in gpu.processes)
        gpus.append(replace(gpu, processes=tuple(
            replace(p, limit_bytes=total - (others - p.weights_bytes - p.steady_extra_bytes))
            for p in gpu.processes
        )))
    return replace(scenario, gpus=tuple(gpus))
