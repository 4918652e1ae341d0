"""What an engine says of its own memory, beside what NVML counts for its processes.

vLLM publishes its memory plan in `vllm:cache_config_info`: the share of the GPU it may take
(`gpu_memory_utilization`), the KV cache's size in tokens (`num_gpu_blocks` x `block_size`)
and, where it was fixed (`--kv-cache-memory-bytes`, or the CPU backend's KV space), in bytes
(`kv_cache_memory_bytes`; "None" when vLLM sized it from its profile). The rest of its
start-up profile (the weights, the activations' peak, the CUDA graphs) goes to its log only
("Model loading took …", "Available KV cache memory: …", "Graph capturing finished in …,
took …"): no metric carries it, and gpuwatch reads no engine's log. Those parts are named as
not exposed, and what NVML counts beyond the KV cache is one remainder. SGLang exposes its KV
pool in tokens (`sglang:max_total_num_tokens`), neither its fraction nor bytes; other
engines no plan at all.

Pure; runs after the engine analyzer (derived.engines) on every tick with engines.
"""

from __future__ import annotations

from gpuwatch.model import Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived, EngineMemory
from gpuwatch.signals.pools import pool_fraction

VLLM_LOG_ONLY = {
    "weights": "vLLM writes it only to its start-up log (\"Model loading took … GiB\")",
    "activations_peak": "vLLM writes it only to its start-up log (its memory profile)",
    "cuda_graphs": "vLLM writes it only to its start-up log (\"Graph capturing finished … "
                   "took … GiB\")",
}
NOT_EXPOSED = {
    "vllm": VLLM_LOG_ONLY,
    "sglang": {"weights": "not in SGLang's metrics", "kv_cache_bytes": "SGLang exposes its KV "
               "pool in tokens only", "planned_share": "mem_fraction_static is not a metric"},
}


class EngineMemoryAnalyzer:
    def __init__(self, config=None) -> None:
        zone = getattr(getattr(config, "signals", None), "zone", None)
        self.vllm_default = getattr(zone, "vllm_default_utilization", 0.9)

    def update(self, tick: Tick, derived: Derived, conditions: Conditions) -> list:
        if not derived.engines:
            derived.engine_memory = []
            return []
        out = []
        for gpu in tick.gpus:
            used = {p.pid: p.used_memory_bytes for p in gpu.processes}
            for name in sorted(derived.engines):
                e = derived.engines[name]
                pids = sorted(p for p in set(e.pids) if p in used)
                if not pids:
                    continue
                held = [used[p] for p in pids]
                nvml = sum(held) if None not in held else None  # type: ignore[arg-type]
                frac = pool_fraction(e, self.vllm_default)
                total = gpu.memory_total_bytes
                kv = e.kv_pool_bytes
                out.append(EngineMemory(
                    engine=name, kind=e.kind, gpu_uuid=gpu.uuid, gpu_index=gpu.index,
                    processes={p: used[p] for p in pids}, nvml_used_bytes=nvml,
                    planned_bytes=frac[0] * total if frac is not None and total else None,
                    planned_source=f"{frac[0]:g} of total ({frac[1]})" if frac else "",
                    kv_cache_bytes=kv, kv_cache_tokens=e.kv_pool_tokens,
                    # negative: the KV cache is not in this GPU's memory (a CPU backend)
                    other_bytes=nvml - kv if nvml is not None and kv is not None
                    and nvml >= kv else None,
                    not_exposed=dict(NOT_EXPOSED.get(e.kind, {}))))
        derived.engine_memory = out
        return []
