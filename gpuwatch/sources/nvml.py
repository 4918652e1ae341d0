"""The real NVIDIA driver, through nvidia-ml-py (imported as pynvml).

Calls run on executor threads, never on the event loop. A field the GPU does not support
is remembered per GPU and never asked again; a lost GPU is isolated (reported lost, not
queried); a missing library or driver makes the whole backend unavailable, and the daemon
retries with backoff.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpuwatch.model import GpuSample, ProbeSample
from gpuwatch.sources.base import BackendUnavailable
from gpuwatch.sources.gpu_depth import make_collectors
from gpuwatch.sources.gpu_depth.mig import MigDevice, read_mig
from gpuwatch.sources.process_lists import KINDS, ProcessList
from gpuwatch.sources.processes import ProcessInfo
from gpuwatch.xid import describe

log = logging.getLogger(__name__)

MIB = 1024 * 1024


class _GpuLost(Exception):
    pass


class _Device:
    """One GPU: its handle, identity and what it turned out not to support."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.uuid = pynvml.nvmlDeviceGetUUID(handle)
        self.name = pynvml.nvmlDeviceGetName(handle)
        try:
            self.pci_bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
        except pynvml.NVMLError:
            self.pci_bus_id = ""
        self.unsupported: set[str] = set()
        self.lost = False
        self.memory_v2 = True
        # field -> versioned wrapper used instead of an unversioned one the driver lacks
        self.fallbacks: dict[str, Callable] = {}
        self.xid_total: dict[str, int] = {}
        self.xid_last_seen: dict[str, float] = {}
        self.last_xid: int | None = None
        collectors = make_collectors()
        self.collectors = [c for c in collectors if c.tier == "slow"]
        self.fast = [c for c in collectors if c.tier == "fast"]
        self.mig: list[MigDevice] = []  # refreshed by the slow tier
        self.mig_devices: dict[str, _Device] = {}  # MIG uuid -> its own unsupported memory
        self.lists = [ProcessList(kind) for kind in KINDS]

    def get(self, field: str, fn: Callable, *args: Any, fallback: Callable | None = None) -> Any:
        """One NVML call; None when unsupported (remembered) or failing this time.

        fallback: a versioned wrapper to switch to when the unversioned one needs a symbol
        this driver lacks (NVMLLibraryMismatchError).
        """
        if field in self.unsupported:
            return None
        try:
            return fn(self.handle, *args)
        except pynvml.NVMLLibraryMismatchError:
            if fallback is None:
                self.unsupported.add(field)
                log.warning("GPU %d: %s: library/driver mismatch; not asking again",
                            self.index, field)
                return None
            self.fallbacks[field] = fallback
            return self.get(field, fallback, *args)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            self.unsupported.add(field)
            log.info("GPU %d: %s not supported; not asking again", self.index, field)
        except pynvml.NVMLError_GpuIsLost:
            raise _GpuLost() from None
        except pynvml.NVMLError as exc:
            log.debug("GPU %d: %s failed: %s", self.index, field, exc)
        return None


class _MigHandle(_Device):
    """A MIG device's handle with its own memory of what it does not support."""

    def __init__(self, index: int, mig: MigDevice) -> None:  # no NVML calls: mig has them
        self.index = index
        self.handle = mig.handle
        self.uuid = mig.uuid
        self.name = mig.name
        self.pci_bus_id = ""
        self.unsupported = set()
        self.lost = False
        self.fallbacks = {}
        self.lists = [ProcessList(kind) for kind in KINDS]


class NvmlBackend:
    name = "nvml"

    def __init__(self, only: list[int] | None = None, xid_events: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.only = set(only or [])
        self._clock = clock  # when an empty process list is due again
        self.xid_events = xid_events
        self.driver_version = ""
        self.devices: list[_Device] = []
        self._procinfo = ProcessInfo()
        self._event_set: Any = None
        self._lock = threading.Lock()  # fast and slow tiers share devices
        self._opened = False

    # -- life cycle -------------------------------------------------------------------
    def open(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML init failed: {exc}") from None
        except OSError as exc:  # a broken libnvidia-ml.so
            raise BackendUnavailable(f"NVML library could not be loaded: {exc}") from None
        self._opened = True
        try:
            self.driver_version = pynvml.nvmlSystemGetDriverVersion()
            count = pynvml.nvmlDeviceGetCount()
            devices = []
            for i in range(count):
                if self.only and i not in self.only:
                    continue
                try:
                    devices.append(_Device(i, pynvml.nvmlDeviceGetHandleByIndex(i)))
                except pynvml.NVMLError as exc:
                    log.warning("GPU %d skipped: %s", i, exc)
            self.devices = devices
        except pynvml.NVMLError as exc:
            self.close()
            raise BackendUnavailable(f"NVML enumeration failed: {exc}") from None
        if self.xid_events:
            self._register_xid()

    def close(self) -> None:
        self._procinfo.close()
        if self._event_set is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        if self._opened:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            self._opened = False

    def _register_xid(self) -> None:
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.info("XID events unavailable: %s", exc)
            return
        for dev in self.devices:
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(dev.handle)
                mask = pynvml.nvmlEventTypeXidCriticalError & supported
                if mask:
                    pynvml.nvmlDeviceRegisterEvents(dev.handle, mask, self._event_set)
            except pynvml.NVMLError as exc:
                log.info("GPU %d: XID events unavailable: %s", dev.index, exc)

    def _drain_xid(self, now: float) -> None:
        """Poll (timeout 0) until no event is pending: never blocks the tick."""
        if self._event_set is None:
            return
        by_handle: dict[int, _Device] = {}
        by_uuid: dict[str, _Device] = {}
        for _ in range(256):
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, 0)
            except pynvml.NVMLError_Timeout:
                return
            except pynvml.NVMLError as exc:
                log.debug("XID poll failed: %s", exc)
                return
            if not by_handle:  # built only when an event came (most ticks see none)
                by_handle = {id(d.handle): d for d in self.devices}
                by_uuid = {d.uuid: d for d in self.devices}
            dev = by_handle.get(id(data.device))
            if dev is None:
                try:
                    dev = by_uuid.get(pynvml.nvmlDeviceGetUUID(data.device))
                except pynvml.NVMLError:
                    dev = None
            if dev is not None:
                xid = int(data.eventData)
                dev.xid_total[str(xid)] = dev.xid_total.get(str(xid), 0) + 1
                dev.xid_last_seen[str(xid)] = now
                dev.last_xid = xid
                what = describe(xid)
                log.warning("GPU %d: XID %d: %s; action: %s", dev.index, xid, what.description,
                            what.action)

    # -- sampling ---------------------------------------------------------------------
    def probes(self, now: float) -> list[ProbeSample] | None:
        return None

    def sample(self, now: float) -> list[GpuSample]:
        with self._lock:
            self._drain_xid(now)
            self._procinfo.poll_exits()
            out = []
            for dev in self.devices:
                out.append(self._sample_device(dev))
                if not dev.lost:
                    out.extend(self._sample_mig(dev, mig) for mig in dev.mig)
        self._procinfo.forget_except({p.pid for g in out for p in g.processes})
        return out

    def _sample_device(self, dev: _Device) -> GpuSample:
        s = GpuSample(index=dev.index, uuid=dev.uuid, name=dev.name, pci_bus_id=dev.pci_bus_id)
        if dev.lost:
            s.lost = True
            return s
        try:
            self._fill(dev, s)
        except _GpuLost:
            dev.lost = True
            s.lost = True
            log.error("GPU %d (%s) is lost; isolating it", dev.index, dev.uuid)
        s.xid_events_total = dict(dev.xid_total)
        s.xid_last_seen = dict(dev.xid_last_seen)
        s.last_xid = dev.last_xid
        return s

    def _fill(self, dev: _Device, s: GpuSample) -> None:
        mem = None
        if dev.memory_v2:
            mem = dev.get("memory_v2", pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlMemory_v2)
            if mem is None and "memory_v2" in dev.unsupported:
                dev.memory_v2 = False
        if mem is None and not dev.memory_v2:
            mem = dev.get("memory", pynvml.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            s.memory_total_bytes = int(mem.total)
            s.memory_used_bytes = int(mem.used)  # v2: excludes driver-reserved memory
            s.memory_free_bytes = int(mem.free)
            if dev.memory_v2:
                s.memory_reserved_bytes = int(mem.reserved)
        util = dev.get("utilization", pynvml.nvmlDeviceGetUtilizationRates)
        if util is not None:
            s.utilization_ratio = util.gpu / 100.0
            s.memory_utilization_ratio = util.memory / 100.0
        gpu_sensor = pynvml.NVML_TEMPERATURE_GPU
        temp = dev.get("temperature_v", pynvml.nvmlDeviceGetTemperatureV, gpu_sensor)
        if temp is None and "temperature_v" in dev.unsupported:  # older driver
            temp = dev.get("temperature", pynvml.nvmlDeviceGetTemperature, gpu_sensor)
        if temp is not None:
            s.temperature_celsius = float(temp)
        power = dev.get("power", pynvml.nvmlDeviceGetPowerUsage)
        if power is not None:
            s.power_watts = power / 1000.0
        sm = dev.get("sm_clock", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        if sm is not None:
            s.sm_clock_hz = sm * 1e6
        memclk = dev.get("mem_clock", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM)
        if memclk is not None:
            s.memory_clock_hz = memclk * 1e6
        s.clocks_event_reasons = dev.get(
            "clocks_event_reasons", pynvml.nvmlDeviceGetCurrentClocksEventReasons
        )
        for c in dev.fast:
            for field, value in c.read(dev).items():
                setattr(s, field, value)
        # With MIG on, processes belong to their instances (sampled below), never twice.
        s.processes = [] if dev.mig else self._processes(dev)

    def _sample_mig(self, parent: _Device, mig: MigDevice) -> GpuSample:
        """A MIG instance as a GPU of its own: its memory and processes, judged on its own
        threshold row. NVML may not tell per-process memory inside MIG: then it is absent."""
        dev = parent.mig_devices.get(mig.uuid)
        if dev is None:
            dev = parent.mig_devices[mig.uuid] = _MigHandle(parent.index, mig)
        s = GpuSample(index=parent.index, uuid=mig.uuid, name=mig.name,
                      pci_bus_id=parent.pci_bus_id, mig_parent_uuid=parent.uuid,
                      mig_instance=mig.instance, mig_profile=mig.profile)
        try:
            mem = dev.get("memory_v2", pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlMemory_v2)
            if mem is None:
                mem = dev.get("memory", pynvml.nvmlDeviceGetMemoryInfo)
            if mem is not None:
                s.memory_total_bytes = int(mem.total)
                s.memory_used_bytes = int(mem.used)
                s.memory_free_bytes = int(mem.free)
            s.processes = self._processes(dev)
        except _GpuLost:
            parent.lost = True
            s.lost = True
        return s

    def _processes(self, dev: _Device) -> list:
        now = self._clock()
        found: dict[int, tuple[int | None, str]] = {}
        for lst in dev.lists:
            if not lst.due(now):
                continue
            field = f"processes_{lst.kind}"
            entries = dev.get(field, dev.fallbacks.get(field) or lst.reader(),
                              fallback=lst.read_v2)
            lst.answered(entries, now)
            for pid, used in entries or ():
                # used is None where the driver cannot tell (WDDM, some MIG setups); a pid
                # in several lists keeps its first kind (compute before graphics).
                prev_used, first_kind = found.get(pid, (None, lst.kind))
                known = [u for u in (prev_used, used) if u is not None]
                found[pid] = (max(known) if known else None, first_kind)
        return [
            self._procinfo.describe(pid, None if used is None else int(used), kind)
            for pid, (used, kind) in sorted(found.items())
        ]

    def sample_slow(self, now: float) -> dict[str, dict]:
        out: dict[str, dict] = {}
        with self._lock:
            devices = [d for d in self.devices if not d.lost]
        for dev in devices:
            fields: dict[str, Any] = {}
            try:
                mig_mode, mig = read_mig(dev)
                dev.mig = mig
                if mig_mode is not None:
                    fields["mig_mode"] = mig_mode
                for c in dev.collectors:
                    fields.update(c.read(dev))
                energy = dev.get("energy", pynvml.nvmlDeviceGetTotalEnergyConsumption)
                if energy is not None:
                    fields["energy_joules_total"] = energy / 1000.0  # mJ
                # Each PCIe call samples a byte counter for 20 ms by design.
                tx = dev.get("pcie_tx", pynvml.nvmlDeviceGetPcieThroughput,
                             pynvml.NVML_PCIE_UTIL_TX_BYTES)
                rx = dev.get("pcie_rx", pynvml.nvmlDeviceGetPcieThroughput,
                             pynvml.NVML_PCIE_UTIL_RX_BYTES)
                if tx is not None:
                    fields["pcie_tx_bytes_per_second"] = tx * 1024.0  # KB/s
                if rx is not None:
                    fields["pcie_rx_bytes_per_second"] = rx * 1024.0
            except _GpuLost:
                dev.lost = True
                continue
            out[dev.uuid] = fields
        return out
