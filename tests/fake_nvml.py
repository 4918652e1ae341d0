"""A fake driver behind the real pynvml module: its functions are patched, its error
classes are the real ones, so the backend's error handling is exercised as written."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pynvml

GIB = 1024**3


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)  # NVMLError.__new__ returns the specific subclass


class FakeGpu:
    def __init__(self, index: int, name: str = "NVIDIA H200", total: int = 140 * GIB) -> None:
        self.index = index
        self.uuid = f"GPU-fake-{index}"
        self.name = name
        self.total = total
        self.used = 10 * GIB
        self.reserved = 512 * 1024**2
        self.processes: list[SimpleNamespace] = []
        # field name -> exception (or callable returning one) raised by that call
        self.fail: dict[str, Exception] = {}


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: collections.Counter[str] = collections.Counter()
        self.events: list[SimpleNamespace] = []

    def _call(self, field: str, handle: FakeGpu):
        self.calls[(field, handle.index)] += 1
        exc = handle.fail.get(field)
        if exc is not None:
            raise exc

    def install(self, monkeypatch) -> None:
        f = self
        P = pynvml

        def init():
            if f.init_error is not None:
                raise f.init_error

        def memory(h, version=None):
            f._call("memory_v2" if version else "memory", h)
            if version:
                return SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used
                                       - h.reserved, reserved=h.reserved)
            return SimpleNamespace(total=h.total, used=h.used + h.reserved,
                                   free=h.total - h.used - h.reserved)

        def simple(field, value):
            def fn(h, *args):
                f._call(field, h)
                return value(h, *args) if callable(value) else value
            return fn

        def procs(field):
            def fn(h):
                f._call(field, h)
                return list(h.processes) if field == "compute" else []
            return fn

        def wait(es, timeout):
            if f.events:
                return f.events.pop(0)
            raise err(P.NVML_ERROR_TIMEOUT)

        patches = {
            "nvmlInit": init,
            "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: "580.159.03",
            "nvmlDeviceGetCount": lambda: len(f.gpus),
            "nvmlDeviceGetHandleByIndex": lambda i: f.gpus[i],
            "nvmlDeviceGetUUID": lambda h: h.uuid,
            "nvmlDeviceGetName": lambda h: h.name,
            "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=f"00000000:{h.index:02X}:00.0"),
            "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetUtilizationRates": simple(
                "utilization", SimpleNamespace(gpu=37, memory=12)),
            "nvmlDeviceGetTemperatureV": simple("temperature_v", 51),
            "nvmlDeviceGetTemperature": simple("temperature", 52),
            "nvmlDeviceGetPowerUsage": simple("power", 123456),
            "nvmlDeviceGetEnforcedPowerLimit": simple("power_limit", 700000),
            "nvmlDeviceGetClockInfo": simple(
                "clock", lambda h, t: 1980 if t == P.NVML_CLOCK_SM else 3201),
            "nvmlDeviceGetCurrentClocksEventReasons": simple("reasons", 0x4),
            "nvmlDeviceGetTotalEccErrors": simple(
                "ecc", lambda h, e, c: 3 if e == P.NVML_MEMORY_ERROR_TYPE_CORRECTED else 0),
            "nvmlDeviceGetRemappedRows": simple("remapped", (1, 0, 0, 0)),
            "nvmlDeviceGetComputeRunningProcesses": procs("compute"),
            "nvmlDeviceGetGraphicsRunningProcesses": procs("graphics"),
            "nvmlDeviceGetMPSComputeRunningProcesses": procs("mps"),
            "nvmlDeviceGetComputeRunningProcesses_v2": procs("compute_v2"),
            "nvmlDeviceGetTotalEnergyConsumption": simple("energy", 5_000_000),
            "nvmlDeviceGetPcieThroughput": simple("pcie", 1000),
            "nvmlEventSetCreate": lambda: object(),
            "nvmlEventSetFree": lambda es: None,
            "nvmlDeviceGetSupportedEventTypes": lambda h: P.nvmlEventTypeXidCriticalError,
            "nvmlDeviceRegisterEvents": lambda h, mask, es: None,
            "nvmlEventSetWait_v2": wait,
        }
        for name, fn in patches.items():
            monkeypatch.setattr(pynvml, name, fn)


def proc(pid: int, used: int | None) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, usedGpuMemory=used)
