"""Memory zone of a GPU: safe / warning / critical against its threshold row.

The zone judges **unplanned** memory, not NVML's used figure: an inference engine that
pre-allocates a pool by design (vLLM reserves `gpu_memory_utilization` x total memory for
weights, activations and its KV-cache blocks; SGLang `mem_fraction_static`) sits above the
A100's red line while perfectly healthy, and that is not pressure. The rule:

    unplanned = used - sum over engines on this GPU of min(engine's used here, its pool)
    pool      = planned fraction x the GPU's total memory

- An engine is on a GPU when one of its pids is among the GPU's processes.
- The planned fraction is `gpu_memory_utilization` (vLLM's cache_config_info) or
  `mem_fraction_static` (SGLang); a vLLM engine that publishes neither gets vLLM's default
  (0.9). Other engines plan nothing.
- What an engine holds beyond its pool, every other process, and memory no process
  accounts for (driver, contexts) stay unplanned and are judged.
- Without per-process figures the whole pool is taken as planned (used minus pool).
- KV-cache usage does not move NVML memory under a pre-allocating engine, so it plays no
  part: a full KV cache is the engine doing its job.

Zones have hysteresis: a higher zone is entered after `enter_samples` consecutive samples
in it, and left only once the value is `hysteresis_ratio` x total below where it starts
and has stayed there for `hold_seconds`.
"""

from __future__ import annotations

from typing import Any

from gpuwatch.model import GpuSample
from gpuwatch.signals.conditions import Hold
from gpuwatch.signals.pools import EnginePool, engine_pools, pool_fraction  # noqa: F401 (its public rule)

ZONE_NAMES = ("safe", "warning", "critical")


def planned_bytes(
    gpu: GpuSample, engines: dict[str, Any], vllm_default: float,
    pools: list[EnginePool] | None = None,
) -> tuple[float, list[str]]:
    """Memory on this GPU that engines pre-allocated by design, and why (notes). pools:
    this GPU's, when the caller has them already."""
    planned, notes = 0.0, []
    for e in engine_pools(gpu, engines, vllm_default) if pools is None else pools:
        held = e.pool if e.held is None else min(e.pool, e.held)
        planned += held
        notes.append(f"zone: {e.engine} pre-allocates {e.source}: "
                     f"{held / 2**30:.1f} GiB planned")
    return planned, notes


class ZoneState:
    """Zone with entry debounce, exit hysteresis and a minimum hold."""

    def __init__(self) -> None:
        self._hold = Hold()
        self._pending = 0  # consecutive samples above the current zone
        self._pending_level = 0

    @property
    def level(self) -> int:
        return self._hold.level

    def update(self, value: float, warning: float, critical: float, band: float,
               enter_samples: int, t: float = 0.0, hold_seconds: float = 0.0) -> int:
        raw = 2 if value > critical else 1 if value > warning else 0
        if raw > self.level:
            self._pending_level = raw if self._pending == 0 else min(self._pending_level, raw)
            self._pending += 1
            if self._pending >= enter_samples:
                self._hold.update(t, self._pending_level, hold_seconds)
                self._pending = 0
            return self.level
        self._pending = 0
        keep = 2 if value > critical - band else 1 if value > warning - band else 0
        return self._hold.update(t, min(self.level, keep), hold_seconds)
