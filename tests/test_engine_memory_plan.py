"""An engine's own memory plan beside NVML's figure for its processes
(gpuwatch/signals/engine_memory.py), from the real vLLM 0.32 capture: what vLLM exposes
(its GPU share, the KV cache in tokens and bytes) and what it keeps to its log."""

from __future__ import annotations

from pathlib import Path

from gpuwatch.config import load
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.exporter.state_json import state_document
from gpuwatch.model import EngineSample, GpuSample, ProcessSample, Tick
from gpuwatch.signals.pipeline import Pipeline

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
GIB = 1 << 30
TOTAL = 80 * GIB


def tick(t: float, expo: str, kind: str = "vllm") -> Tick:
    return Tick(t=t, gpus=[GpuSample(
        index=0, uuid="GPU-a", name="NVIDIA A100-SXM4-80GB", memory_total_bytes=TOTAL,
        memory_used_bytes=74 * GIB, processes=[
            ProcessSample(pid=10, name="VLLM::EngineCore", used_memory_bytes=72 * GIB),
            ProcessSample(pid=99, name="other", used_memory_bytes=GIB)])],
        engines=[EngineSample(name="e0", kind=kind, url="http://127.0.0.1:8000/metrics",
                              exposition=expo, t=t, pids=[10])])


def run(expo: str, kind: str = "vllm"):
    p = Pipeline.from_config(load(None, environ={}))
    for k in range(3):
        p.update(tick(1.8e9 + 2 * k, expo, kind))
    return p


REAL = (FIXTURES / "vllm-0.32.0-cpu-real-load.prom").read_text()
# the capture forced its block count (16 blocks, ~4 MiB on the CPU build) beside a 1 GiB
# kv_cache_memory_bytes; without the override, the bytes the operator gave are the pool
SIZED_IN_BYTES = REAL.replace('num_gpu_blocks_override="16"', 'num_gpu_blocks_override="None"')


def test_vllm_032_shows_its_plan_beside_nvml_and_names_what_it_keeps_to_its_log():
    p = run(SIZED_IN_BYTES)
    [m] = p.derived.engine_memory
    assert (m.engine, m.kind, m.gpu_uuid, m.gpu_index) == ("e0", "vllm", "GPU-a", 0)
    assert m.processes == {10: 72 * GIB} and m.nvml_used_bytes == 72 * GIB  # pid 99 is not its
    assert m.planned_bytes == 0.92 * TOTAL and "gpu_memory_utilization" in m.planned_source
    assert m.kv_cache_bytes == GIB and m.kv_cache_tokens == 16 * 128  # kv_cache_memory_bytes
    assert m.other_bytes == 71 * GIB
    assert set(m.not_exposed) == {"weights", "activations_peak", "cuda_graphs"}
    assert all("start-up log" in why for why in m.not_exposed.values())
    doc = state_document(Snapshot(tick=None, derived=p.derived))
    [row] = doc["signals"]["engine_memory"]
    assert row["kv_cache_bytes"] == GIB and row["processes"] == {"10": 72 * GIB}


def test_a_forced_block_count_makes_the_kv_bytes_unknown_not_the_given_gigabyte():
    [m] = run(REAL).derived.engine_memory
    assert m.kv_cache_bytes is None and m.kv_cache_tokens == 16 * 128 and m.other_bytes is None


def test_an_engine_that_sized_its_kv_cache_itself_has_tokens_but_no_bytes():
    text = SIZED_IN_BYTES.replace('kv_cache_memory_bytes="1073741824"',
                                  'kv_cache_memory_bytes="None"')
    [m] = run(text).derived.engine_memory
    assert m.kv_cache_bytes is None and m.kv_cache_tokens == 2048 and m.other_bytes is None


def test_an_engine_with_no_plan_has_only_nvml_figures():
    [m] = run((FIXTURES / "llamacpp-0.3.36-real-load.prom").read_text(), "llamacpp") \
        .derived.engine_memory
    assert m.nvml_used_bytes == 72 * GIB and m.planned_bytes is None
    assert m.kv_cache_bytes is None and m.not_exposed == {}
