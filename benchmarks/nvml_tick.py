"""Fast-tier tick per GPU against the raw NVML calls it makes, and the slow tier's cost per
collector (MIG mode, field values, fabric, GPM, per-process utilization) (needs a GPU).

    python -m benchmarks.nvml_tick [--iterations 2000] [--slow-iterations 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time

import pynvml

from benchmarks.report import emit
from gpuwatch.sources.nvml import NvmlBackend


def raw_calls(handle) -> None:
    """Exactly the fast-tier calls the backend makes for one GPU, with no bookkeeping."""
    pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)
    pynvml.nvmlDeviceGetUtilizationRates(handle)
    pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU)
    pynvml.nvmlDeviceGetPowerUsage(handle)
    pynvml.nvmlDeviceGetEnforcedPowerLimit(handle)
    pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
    pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    for kind in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                 pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
        with contextlib.suppress(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetTotalEccErrors(handle, kind, pynvml.NVML_VOLATILE_ECC)
    with contextlib.suppress(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRemappedRows(handle)
    pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
    with contextlib.suppress(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def slow_tier_costs(backend: NvmlBackend, n: int) -> dict:
    """Median µs per read of each slow-tier collector on GPU 0, after a first read that
    settles what the GPU supports; and the whole slow read (PCIe's 20 ms samples included)."""
    from gpuwatch.sources.gpu_depth.mig import read_mig

    dev = backend.devices[0]
    readers = {"mig_mode": lambda: read_mig(dev)}
    readers.update({c.name: (lambda c=c: c.read(dev)) for c in dev.collectors})
    for fn in readers.values():
        fn()
    out = {name: statistics.median(timed(fn, n)) * 1e6 for name, fn in readers.items()}
    out = {k: round(v, 1) for k, v in out.items()}
    out["unsupported"] = sorted(dev.unsupported)
    whole = timed(lambda: backend.sample_slow(time.time()), max(5, n // 20))
    out["sample_slow_ms_median"] = round(statistics.median(whole) * 1e3, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--slow-iterations", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args()
    backend = NvmlBackend(xid_events=True)
    backend.open()
    gpus = len(backend.devices)
    handles = [d.handle for d in backend.devices]
    procs = sum(len(g.processes) for g in backend.sample(0))
    for _ in range(50):  # warm caches (psutil, NotSupported set)
        backend.sample(0)
        for h in handles:
            raw_calls(h)
    tick = timed(lambda: backend.sample(time.time()), args.iterations)
    raw = timed(lambda: [raw_calls(h) for h in handles], args.iterations)
    res = {
        "gpus": gpus,
        "processes": procs,
        "driver": backend.driver_version,
        "gpu_name": backend.devices[0].name if gpus else "",
        "python": platform.python_version(),
        "tick_per_gpu_us_median": statistics.median(tick) / gpus * 1e6,
        "tick_per_gpu_us_p99": sorted(tick)[int(0.99 * len(tick))] / gpus * 1e6,
        "raw_per_gpu_us_median": statistics.median(raw) / gpus * 1e6,
        "raw_per_gpu_us_p99": sorted(raw)[int(0.99 * len(raw))] / gpus * 1e6,
    }
    res["ratio_median"] = res["tick_per_gpu_us_median"] / res["raw_per_gpu_us_median"]
    res["slow_tier"] = slow_tier_costs(backend, args.slow_iterations)
    backend.close()
    emit(res, args.json)


if __name__ == "__main__":
    main()
