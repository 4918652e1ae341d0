"""Memory of a simulated process as a pure function of time since the scenario started.

Each process goes through the life cycle of a model server (spec §3): loading (weights
arrive), warm-up (a peak from autotune / graph capture), then steady serving with the
caching allocator's sawtooth, optional transients, and optional leaks. A process that
would outgrow its GPU "dies" and restarts with a new pid, as a real OOM would do.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MIB = 1 << 20  # every simulated size is in MiB, like the threshold table
GIB = 1024**3


@dataclass(frozen=True)
class ProcessSpec:
    slot: int
    name: str
    weights_bytes: float
    steady_extra_bytes: float = 1.0 * GIB
    warmup_peak_bytes: float = 2.0 * GIB
    load_seconds: float = 8.0
    warmup_seconds: float = 8.0
    # When the process started, in seconds from the scenario's start (negative: before).
    start_seconds: float = 0.0
    sawtooth_bytes: float = 256 * MIB
    sawtooth_period_seconds: float = 45.0
    transient_bytes: float = 0.0
    transient_every_seconds: float = 600.0
    transient_seconds: float = 120.0
    leak_bytes_per_second: float = 0.0
    leak_after_seconds: float = 20.0
    # The leak stops after this long (a fix deployed, a cache that finally fills).
    leak_seconds: float = math.inf
    # Loading arrives in this many bursts (0: smoothly), as a model's shards do.
    load_bursts: int = 0
    step_bytes: float = 0.0
    step_every_seconds: float = 600.0
    noise_bytes: float = 8 * MIB
    # Limit above which this process "OOMs" and restarts (set by the scenario from the GPU).
    limit_bytes: float = math.inf
    restart_delay_seconds: float = 10.0
    user: str = "inference"
    # Engine this process serves (its exposition is simulated too), or "".
    engine: str = ""
    probe: str = ""  # "" | "healthy" | "fragmenting"


def _noise(seed: int, slot: int, k: int) -> float:
    """Deterministic N(0,1)-ish value for (seed, process, sample index)."""
    return random.Random(seed * 1_000_003 + slot * 7919 + k).gauss(0.0, 1.0)


def _growth(spec: ProcessSpec, age: float) -> float:
    """Bytes kept by leaks after `age` seconds of life."""
    if age <= spec.leak_after_seconds:
        return 0.0
    leaked = min(age - spec.leak_after_seconds, spec.leak_seconds)
    out = spec.leak_bytes_per_second * leaked
    if spec.step_bytes:
        out += spec.step_bytes * math.floor(leaked / spec.step_every_seconds)
    return out


def lifetime(spec: ProcessSpec) -> float:
    """Seconds until a leaking process outgrows its limit (inf when it never does)."""
    room = spec.limit_bytes - (spec.weights_bytes + spec.steady_extra_bytes
                               + spec.sawtooth_bytes)
    if not math.isfinite(room) or room <= 0:
        return math.inf
    if spec.leak_bytes_per_second > 0:
        if spec.leak_bytes_per_second * spec.leak_seconds < room and not spec.step_bytes:
            return math.inf  # the leak stops before the GPU is full
        return spec.leak_after_seconds + room / spec.leak_bytes_per_second
    if spec.step_bytes > 0:
        return spec.leak_after_seconds + spec.step_every_seconds * math.ceil(
            room / spec.step_bytes
        )
    return math.inf


def generation(spec: ProcessSpec, elapsed: float) -> tuple[int, float] | None:
    """(restart generation, age within it), or None while the process is not running."""
    since = elapsed - spec.start_seconds
    if since < 0:
        return None
    life = lifetime(spec)
    if not math.isfinite(life):
        return 0, since
    period = life + spec.restart_delay_seconds
    gen = int(since // period)
    age = since - gen * period
    if age > life:
        return None  # dead, restarting
    return gen, age


def used_bytes(spec: ProcessSpec, age: float, seed: int, k: int) -> tuple[float, str]:
    """(memory used, life-cycle phase) at `age` seconds into this generation."""
    if age < spec.load_seconds:
        frac = age / spec.load_seconds
        if spec.load_bursts:
            frac = math.ceil(frac * spec.load_bursts) / spec.load_bursts
        return max(256 * MIB, spec.weights_bytes * frac), "loading"
    base = spec.weights_bytes
    age_w = age - spec.load_seconds
    if age_w < spec.warmup_seconds:
        # Peak in the middle of warm-up (graph capture), then settle.
        bump = math.sin(math.pi * age_w / spec.warmup_seconds)
        return base + spec.steady_extra_bytes * (age_w / spec.warmup_seconds) + (
            spec.warmup_peak_bytes * bump
        ), "warmup"
    t = age_w - spec.warmup_seconds
    value = base + spec.steady_extra_bytes
    if spec.sawtooth_bytes:
        # The caching allocator grows its pool, then a free or empty_cache returns it.
        value += spec.sawtooth_bytes * ((t % spec.sawtooth_period_seconds)
                                        / spec.sawtooth_period_seconds)
    in_burst = (t % spec.transient_every_seconds) < spec.transient_seconds
    # A burst of several minutes that comes back down, never in the first period of serving.
    if spec.transient_bytes and in_burst and t >= spec.transient_every_seconds:
        value += spec.transient_bytes
    value += _growth(spec, age)
    value += spec.noise_bytes * _noise(seed, spec.slot, k)
    return max(value, 0.0), "steady"
