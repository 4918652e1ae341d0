"""Engines' planned memory on one GPU: what the zone, the leak series and the time to OOM
take from the engines' own facts (derived.engines, set by the engine analyzer).

- The pool an engine plans on a GPU is the KV-cache size the operator fixed
  (vLLM `kv_cache_memory_bytes`, which overrides the share), else its share of the GPU's
  total memory: vLLM `gpu_memory_utilization` (0.9 when not published), SGLang
  `mem_fraction_static`. Other engines plan nothing.
- `held` is what the engine's processes hold here (None when NVML gives no per-process
  figure). `ahead` is the part of the pool not held now: an engine still loading, or asleep,
  takes it (back) by design, so the time to OOM counts it as spent.
- The process holding most of it carries the pool as its floor: growing up to the pool is
  planned, not a leak; only what it holds beyond the pool is judged.
- While an engine sleeps, and for `wake_settle_seconds` after it woke, its memory changes
  by design (released, then taken back): its series hold (not fed, verdict and baselines
  kept), so sleep is neither a leak nor a fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwatch.model import GpuSample

POOL_KEYS = ("gpu_memory_utilization", "mem_fraction_static")


def pool_fraction(engine: Any, vllm_default: float) -> tuple[float, str] | None:
    """(fraction of GPU memory an engine pre-allocates, where the figure came from)."""
    config = getattr(engine, "cache_config", None) or {}
    for key in POOL_KEYS:
        try:
            value = float(config[key])
        except (KeyError, TypeError, ValueError):
            continue
        if 0 < value <= 1:
            return value, key
    if getattr(engine, "kind", "") == "vllm":
        return vllm_default, "vLLM default gpu_memory_utilization"
    return None


@dataclass
class EnginePool:
    engine: str
    pool: float  # bytes planned on this GPU
    source: str  # where the figure came from
    pids: frozenset[int]  # its processes on this GPU
    held: float | None  # bytes its processes hold here; None: not known
    floors: dict[int, float]  # pid -> the part of the pool that pid's series starts from
    quiet: str  # why its memory is not judged now ("" when it is)

    @property
    def ahead(self) -> float:
        """Pool memory the engine will take (back) by design: not headroom."""
        return 0.0 if self.held is None else max(0.0, self.pool - self.held)


def _pool(engine: Any, total: float, vllm_default: float) -> tuple[float, str] | None:
    fixed = getattr(engine, "kv_pool_bytes", None)
    if fixed and 0 < fixed <= total:
        return float(fixed), "kv_cache_memory_bytes"
    frac = pool_fraction(engine, vllm_default)
    return None if frac is None else (frac[0] * total, f"{frac[0]:g} of total ({frac[1]})")


def _quiet(engine: Any, t: float, settle: float) -> str:
    level = getattr(engine, "sleep_level", None)
    if level:
        return f"asleep (level {level})"
    since = getattr(engine, "sleep_changed_at", None)
    if level == 0 and since is not None and 0 <= t - since < settle:
        return f"woke {t - since:.0f}s ago (settling for {settle:g}s)"
    return ""


def engine_pools(gpu: GpuSample, engines: dict[str, Any], vllm_default: float,
                 t: float = 0.0, settle: float = 0.0) -> list[EnginePool]:
    """The engines with processes on this GPU, with what they planned here."""
    total = gpu.memory_total_bytes or 0
    if total <= 0 or not engines:
        return []
    by_pid = {p.pid: p for p in gpu.processes}
    out = []
    for name in sorted(engines):
        engine = engines[name]
        here = sorted((by_pid[pid] for pid in set(getattr(engine, "pids", None) or [])
                       if pid in by_pid), key=lambda p: (-(p.used_memory_bytes or 0), p.pid))
        pool = _pool(engine, total, vllm_default) if here else None
        if pool is None:
            continue
        used = [p.used_memory_bytes for p in here]
        known = None not in used
        held = float(sum(used)) if known else None  # type: ignore[arg-type]
        # the largest holder carries the pool less what the engine's other pids hold
        floors = ({here[0].pid: max(0.0, pool[0] - (held - used[0]))}  # type: ignore[operator]
                  if known else {})
        out.append(EnginePool(name, pool[0], pool[1], frozenset(p.pid for p in here), held, floors,
                              _quiet(engine, t, settle)))
    return out


def of_pid(pools: list[EnginePool], pid: int) -> EnginePool | None:
    return next((e for e in pools if pid in e.pids), None)
