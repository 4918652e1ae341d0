"""Fast-tier tick per GPU against the raw NVML calls it makes, and the slow tier's cost per
collector (MIG mode, field values, fabric, GPM, per-process utilization) (needs a GPU).

    python -m benchmarks.nvml_tick [--iterations 2000] [--slow-iterations 200]
                                   [--once-a-second 30] [--json OUT]

The first figures call back to back, where the driver's cache makes most calls cost a few
microseconds. `--once-a-second N` measures what the daemon pays instead: for N seconds, once a
second, each call of GPU 0 in the order a tick makes them, and the CPU of this thread for each
(the median over the N seconds). It also times, after the tick's own calls, those that left
it: the enforced power limit, ECC and remapped rows (now on the slow tier), and the process
lists as pynvml's wrappers read them (a count, then the list). Those wrapper rows come right
after the one-call reads of the same lists in the same second, so the driver's cache is warm
for them: they do not compare with the one-call rows.
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


def raw_calls(handle, compute_list) -> None:
    """The fast-tier calls the backend makes for one GPU each tick, with no bookkeeping (the
    graphics and MPS lists, empty on most hosts, are asked every 10 s and left out)."""
    from gpuwatch.sources.gpu_depth.thermal import MEMORY_TEMP

    pynvml.nvmlDeviceGetMemoryInfo(handle, pynvml.nvmlMemory_v2)
    pynvml.nvmlDeviceGetUtilizationRates(handle)
    pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU)
    pynvml.nvmlDeviceGetPowerUsage(handle)
    pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
    pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    pynvml.nvmlDeviceGetFieldValues(handle, [MEMORY_TEMP])
    pynvml.nvmlDeviceGetPerformanceState(handle)
    for fn in (pynvml.nvmlDeviceGetEncoderUtilization, pynvml.nvmlDeviceGetDecoderUtilization,
               pynvml.nvmlDeviceGetJpgUtilization, pynvml.nvmlDeviceGetOfaUtilization):
        with contextlib.suppress(pynvml.NVMLError):
            fn(handle)
    compute_list(handle)


def once_a_second(handle, seconds: int) -> dict:
    """Median CPU µs of each call when the calls come once a second, in a tick's order."""
    from gpuwatch.sources.process_lists import ProcessList

    lists = {k: ProcessList(k) for k in ("compute", "graphics", "mps")}
    readers = {k: lst.reader() for k, lst in lists.items()}
    P = pynvml
    calls = [
        ("memory_v2", lambda: P.nvmlDeviceGetMemoryInfo(handle, P.nvmlMemory_v2)),
        ("utilization", lambda: P.nvmlDeviceGetUtilizationRates(handle)),
        ("temperature", lambda: P.nvmlDeviceGetTemperatureV(handle, P.NVML_TEMPERATURE_GPU)),
        ("power", lambda: P.nvmlDeviceGetPowerUsage(handle)),
        ("sm_clock", lambda: P.nvmlDeviceGetClockInfo(handle, P.NVML_CLOCK_SM)),
        ("mem_clock", lambda: P.nvmlDeviceGetClockInfo(handle, P.NVML_CLOCK_MEM)),
        ("clocks_event_reasons", lambda: P.nvmlDeviceGetCurrentClocksEventReasons(handle)),
        ("performance_state", lambda: P.nvmlDeviceGetPerformanceState(handle)),
        ("encoder", lambda: P.nvmlDeviceGetEncoderUtilization(handle)),
        ("decoder", lambda: P.nvmlDeviceGetDecoderUtilization(handle)),
        ("jpg", lambda: P.nvmlDeviceGetJpgUtilization(handle)),
        ("ofa", lambda: P.nvmlDeviceGetOfaUtilization(handle)),
        ("list_compute_one_call", lambda: readers["compute"](handle)),
        ("list_graphics_one_call", lambda: readers["graphics"](handle)),
        ("list_mps_one_call", lambda: readers["mps"](handle)),
        # moved to the slow tier, or read the way pynvml's wrappers do
        ("power_limit (slow tier now)", lambda: P.nvmlDeviceGetEnforcedPowerLimit(handle)),
        ("ecc_corrected (slow tier now)", lambda: P.nvmlDeviceGetTotalEccErrors(
            handle, P.NVML_MEMORY_ERROR_TYPE_CORRECTED, P.NVML_VOLATILE_ECC)),
        ("ecc_uncorrected (slow tier now)", lambda: P.nvmlDeviceGetTotalEccErrors(
            handle, P.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, P.NVML_VOLATILE_ECC)),
        ("remapped_rows (slow tier now)", lambda: P.nvmlDeviceGetRemappedRows(handle)),
        ("list_compute_wrapper", lambda: P.nvmlDeviceGetComputeRunningProcesses(handle)),
        ("list_graphics_wrapper", lambda: P.nvmlDeviceGetGraphicsRunningProcesses(handle)),
        ("list_mps_wrapper", lambda: P.nvmlDeviceGetMPSComputeRunningProcesses(handle)),
    ]
    per: dict[str, list[float]] = {name: [] for name, _ in calls}
    for _ in range(seconds):
        time.sleep(1.0)
        for name, fn in calls:
            t0 = time.thread_time()
            with contextlib.suppress(pynvml.NVMLError):
                fn()
            per[name].append(time.thread_time() - t0)
    return {name: round(statistics.median(v) * 1e6, 1) for name, v in per.items()}


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
    ap.add_argument("--once-a-second", type=int, default=0, metavar="SECONDS")
    ap.add_argument("--json")
    args = ap.parse_args()
    backend = NvmlBackend(xid_events=True)
    backend.open()
    gpus = len(backend.devices)
    handles = [d.handle for d in backend.devices]
    from gpuwatch.sources.process_lists import ProcessList

    lists = [ProcessList("compute").reader() for _ in handles]
    procs = sum(len(g.processes) for g in backend.sample(0))
    for _ in range(50):  # warm caches (psutil, NotSupported set)
        backend.sample(0)
        for h, lst in zip(handles, lists, strict=True):
            raw_calls(h, lst)
    tick = timed(lambda: backend.sample(time.time()), args.iterations)
    raw = timed(lambda: [raw_calls(h, lst) for h, lst in zip(handles, lists, strict=True)],
                args.iterations)
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
    if args.once_a_second and gpus:
        res["once_a_second_cpu_us"] = once_a_second(handles[0], args.once_a_second)
    backend.close()
    emit(res, args.json)


if __name__ == "__main__":
    main()
