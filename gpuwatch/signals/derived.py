"""What the analyzers conclude, per GPU, process and engine; read by the outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class GpuSignals:
    leak_rate_bytes_per_second: float | None = None
    time_to_oom_seconds: float | None = None
    # The daemon's leak verdict for the GPU's own series: 0 none, 1 warning, 2 critical.
    leak_severity: int | None = None
    # The daemon's time-to-OOM verdict: 0 none, 1 warning, 2 critical (horizons).
    time_to_oom_severity: int | None = None
    zone: int | None = None  # 0 safe, 1 warning, 2 critical
    # zone name -> bytes where that zone starts (warning, critical), plus "budget"
    thresholds: dict[str, float] = field(default_factory=dict)
    threshold_row: str = ""
    threshold_calibrated: bool | None = None
    # Memory the zone judged (used minus planned pools such as a vLLM KV cache).
    unplanned_memory_bytes: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class ProcessSignals:
    leak_rate_bytes_per_second: float | None = None
    time_to_oom_seconds: float | None = None
    leak_severity: int | None = None  # the daemon's verdict: 0 none, 1 warning, 2 critical
    fragmentation_ratio: float | None = None
    # Free-block count per MB of free memory (spec §4), from the probe's snapshot.
    free_blocks_per_mb: float | None = None
    largest_free_share: float | None = None
    # NVML used minus allocator reserved (driver context, non-PyTorch allocations).
    unattributed_bytes: float | None = None
    phase: str = ""  # loading | warmup | steady | ""
    notes: list[str] = field(default_factory=list)


@dataclass
class Derived:
    gpus: dict[str, GpuSignals] = field(default_factory=dict)  # by uuid
    processes: dict[tuple[str, int], ProcessSignals] = field(default_factory=dict)
    # by engine name; the engines package defines the value type
    engines: dict[str, Any] = field(default_factory=dict)
    threshold_table: dict[str, str] = field(default_factory=dict)  # version, source

    # get first: these run for every process on every tick, and most already exist
    def gpu(self, uuid: str) -> GpuSignals:
        sig = self.gpus.get(uuid)
        if sig is None:
            sig = self.gpus[uuid] = GpuSignals()
        return sig

    def process(self, uuid: str, pid: int) -> ProcessSignals:
        sig = self.processes.get((uuid, pid))
        if sig is None:
            sig = self.processes[(uuid, pid)] = ProcessSignals()
        return sig
