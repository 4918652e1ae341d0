"""A fake driver behind the real pynvml module: its functions are patched, its error
classes are the real ones, so the backend's error handling is exercised as written."""

from __future__ import annotations

import collections
import ctypes
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
        self.processes: list[SimpleNamespace] = []  # the compute list
        self.graphics_processes: list[SimpleNamespace] = []
        self.mps_processes: list[SimpleNamespace] = []
        # MIG: None = the GPU has no MIG (NotSupported); else the slots, None = empty slot.
        self.mig_slots: list[FakeMig | None] | None = None
        self.mig_enabled = False
        self.gpm_supported = False
        self.gpm_values: dict[int, float] = {}
        # field id -> value (absent: NVML_ERROR_NOT_SUPPORTED for that value)
        self.field_values: dict[int, int] = {}
        self.nvlink_states: list[int] | None = None  # None: no NVLink
        self.fabric: tuple[int, int, int] | None = None  # (state, status, healthMask)
        self.process_util: list[SimpleNamespace] = []
        # fans, P-state, media engines, memory temperature threshold (None: NotSupported)
        self.fan_speed: int | None = None  # an SXM board has no fans
        self.pstate: int = 0
        self.media: dict[str, int] = {"encoder": 0, "decoder": 0, "jpg": 0, "ofa": 0}
        self.memory_temp_max: int | None = 95
        # field name -> exception (or callable returning one) raised by that call
        self.fail: dict[str, Exception] = {}


class FakeMig:
    """A MIG device handle: what NVML answers for it."""

    def __init__(self, parent: FakeGpu, gi: int, ci: int, profile: str, total: int) -> None:
        self.index = parent.index
        self.uuid = f"MIG-fake-{parent.index}-{gi}-{ci}"
        self.name = f"{parent.name} MIG {profile}"
        self.gi, self.ci = gi, ci
        self.total = total
        self.used = 0
        self.reserved = 0
        self.processes: list[SimpleNamespace] = []
        self.fail: dict[str, Exception] = {}


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu], init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: collections.Counter[str] = collections.Counter()
        self.events: list[SimpleNamespace] = []
        # C entry points this driver lacks (an older one): _nvmlGetFunctionPointer fails
        self.missing_symbols: set[str] = set()

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

        def listed(h, kind: str) -> list[SimpleNamespace]:
            return list(h.processes if kind == "compute"
                        else getattr(h, f"{kind}_processes", []))

        def procs(field):
            def fn(h):
                f._call(field, h)
                return listed(h, field.removesuffix("_v2"))
            return fn

        def c_procs(kind):
            """The v3 C entry point: count in and out, the buffer filled when it is large
            enough (the driver's contract, as pynvml's wrapper relies on it)."""
            def fn(h, count_ref, buf):
                try:
                    f._call(kind, h)
                except P.NVMLError as exc:
                    return exc.value
                count = count_ref._obj
                ps = listed(h, kind)
                if buf is None or count.value < len(ps):
                    count.value = len(ps)
                    return P.NVML_SUCCESS if not ps else P.NVML_ERROR_INSUFFICIENT_SIZE
                for i, p in enumerate(ps):
                    buf[i].pid = p.pid
                    buf[i].usedGpuMemory = (P.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                                            if p.usedGpuMemory is None else p.usedGpuMemory)
                count.value = len(ps)
                return P.NVML_SUCCESS
            return fn

        c_symbols = {f"nvmlDevice{fn}RunningProcesses_v3": c_procs(kind)
                     for kind, fn in (("compute", "GetCompute"), ("graphics", "GetGraphics"),
                                      ("mps", "GetMPSCompute"))}

        def fn_pointer(name):
            if name in f.missing_symbols or name not in c_symbols:
                raise err(P.NVML_ERROR_FUNCTION_NOT_FOUND)
            return c_symbols[name]

        def wait(es, timeout):
            if f.events:
                return f.events.pop(0)
            raise err(P.NVML_ERROR_TIMEOUT)

        def mig_mode(h):
            f._call("mig_mode", h)
            if h.mig_slots is None:
                raise err(P.NVML_ERROR_NOT_SUPPORTED)
            return [1 if h.mig_enabled else 0, 1 if h.mig_enabled else 0]

        def mig_handle(h, i):
            f._call("mig_handle", h)
            if h.mig_slots is None or i >= len(h.mig_slots):
                raise err(P.NVML_ERROR_INVALID_ARGUMENT)
            if h.mig_slots[i] is None:
                raise err(P.NVML_ERROR_NOT_FOUND)
            return h.mig_slots[i]

        def gpm_support(h):
            f._call("gpm_support", h)
            return SimpleNamespace(isSupportedDevice=1 if h.gpm_supported else 0)

        samples: dict[int, FakeGpu] = {}
        buffers: list = []

        def address(ptr) -> int:
            return ctypes.cast(ptr, ctypes.c_void_p).value

        def gpm_alloc():
            buffers.append(ctypes.create_string_buffer(8))  # kept alive: a real address
            return ctypes.cast(buffers[-1], P.c_nvmlGpmSample_t)

        def gpm_sample_get(h, sample):
            f._call("gpm_sample", h)
            samples[address(sample)] = h
            return sample

        def gpm_metrics_get(get):
            h = samples[address(get.sample2)]
            for i in range(get.numMetrics):
                m = get.metrics[i]
                if m.metricId in h.gpm_values:
                    m.value = h.gpm_values[m.metricId]
                    m.nvmlReturn = P.NVML_SUCCESS
                else:
                    m.nvmlReturn = P.NVML_ERROR_NOT_SUPPORTED
            return get

        def field_values(h, ids):
            f._call("field_values", h)
            out = []
            for fid in ids:
                if fid in h.field_values:
                    out.append(SimpleNamespace(
                        fieldId=fid, nvmlReturn=P.NVML_SUCCESS,
                        valueType=P.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                        value=SimpleNamespace(ullVal=h.field_values[fid], uiVal=0)))
                else:
                    out.append(SimpleNamespace(fieldId=fid,
                                               nvmlReturn=P.NVML_ERROR_NOT_SUPPORTED))
            return out

        def nvlink_state(h, link):
            f._call("nvlink_state", h)
            if h.nvlink_states is None:
                raise err(P.NVML_ERROR_NOT_SUPPORTED)
            if link >= len(h.nvlink_states):
                raise err(P.NVML_ERROR_INVALID_ARGUMENT)
            return h.nvlink_states[link]

        def fabric_info(h, ref):
            f._call("fabric", h)
            info = ref._obj
            state, status, mask = h.fabric or (P.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, 0, 0)
            info.state, info.status, info.healthMask = state, status, mask
            return P.NVML_SUCCESS

        def process_util(h, since):
            f._call("process_util", h)
            new = [s for s in h.process_util if s.timeStamp > since]
            if not new:
                raise err(P.NVML_ERROR_NOT_FOUND)
            return new

        def fan(h):
            f._call("fan", h)
            if h.fan_speed is None:
                raise err(P.NVML_ERROR_NOT_SUPPORTED)
            return h.fan_speed

        def media(engine):
            def fn(h):
                f._call(engine, h)
                if engine not in h.media:
                    raise err(P.NVML_ERROR_NOT_SUPPORTED)
                return [h.media[engine], 100000]  # [percent, sampling period in us]
            return fn

        def threshold(h, kind):
            f._call(f"threshold_{kind}", h)
            if kind != P.NVML_TEMPERATURE_THRESHOLD_MEM_MAX or h.memory_temp_max is None:
                raise err(P.NVML_ERROR_NOT_SUPPORTED)
            return h.memory_temp_max

        patches = {
            "nvmlInit": init,
            "nvmlDeviceGetFanSpeed": fan,
            "nvmlDeviceGetPerformanceState": simple("pstate", lambda h: h.pstate),
            "nvmlDeviceGetEncoderUtilization": media("encoder"),
            "nvmlDeviceGetDecoderUtilization": media("decoder"),
            "nvmlDeviceGetJpgUtilization": media("jpg"),
            "nvmlDeviceGetOfaUtilization": media("ofa"),
            "nvmlDeviceGetTemperatureThreshold": threshold,
            "nvmlDeviceGetMigMode": mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": simple(
                "mig_count", lambda h: len(h.mig_slots or ())),
            "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
            "nvmlDeviceGetGpuInstanceId": lambda h: h.gi,
            "nvmlDeviceGetComputeInstanceId": lambda h: h.ci,
            "nvmlGpmQueryDeviceSupport": gpm_support,
            "nvmlGpmSampleAlloc": gpm_alloc,
            "nvmlGpmSampleFree": lambda s: None,
            "nvmlGpmSampleGet": gpm_sample_get,
            "nvmlGpmMetricsGet": gpm_metrics_get,
            "nvmlDeviceGetFieldValues": field_values,
            "nvmlDeviceGetNvLinkState": nvlink_state,
            "nvmlDeviceGetGpuFabricInfoV": fabric_info,
            "nvmlDeviceGetProcessUtilization": process_util,
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
            "_nvmlGetFunctionPointer": fn_pointer,
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


def open_backend(monkeypatch, gpus):
    """The real NVML backend over these fake GPUs, opened: (fake, backend)."""
    from gpuwatch.sources.nvml import NvmlBackend

    fake = FakeNvml(gpus)
    fake.install(monkeypatch)
    backend = NvmlBackend(xid_events=False)
    backend.open()
    return fake, backend
