"""MIG: whether it is on, and the MIG devices (GPU instance, compute instance, profile) of a
GPU. Read on the slow tier (the mode query alone costs ~0.1 ms); the fast tier then samples
each instance's memory and processes like a GPU of its own."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pynvml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigDevice:
    handle: Any
    uuid: str
    name: str
    gpu_instance: int
    compute_instance: int

    @property
    def instance(self) -> str:
        return f"gi{self.gpu_instance}/ci{self.compute_instance}"

    @property
    def profile(self) -> str:
        # NVML names a MIG device "<parent name> MIG <profile>", e.g. "... MIG 1g.10gb".
        return self.name.rsplit(" MIG ", 1)[1] if " MIG " in self.name else ""


def read_mig(dev: Any) -> tuple[bool | None, list[MigDevice]]:
    """(MIG on, its devices). (None, []) where the GPU has no MIG (asked once)."""
    mode = dev.get("mig_mode", pynvml.nvmlDeviceGetMigMode)
    if mode is None:
        return None, []
    if mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
        return False, []
    count = dev.get("mig_count", pynvml.nvmlDeviceGetMaxMigDeviceCount)
    out: list[MigDevice] = []
    for i in range(count or 0):
        try:
            h = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
        except pynvml.NVMLError_NotFound:
            continue  # an empty slot
        except pynvml.NVMLError as exc:
            log.debug("GPU %d: MIG slot %d: %s", dev.index, i, exc)
            continue
        try:
            out.append(MigDevice(
                handle=h, uuid=pynvml.nvmlDeviceGetUUID(h), name=pynvml.nvmlDeviceGetName(h),
                gpu_instance=pynvml.nvmlDeviceGetGpuInstanceId(h),
                compute_instance=pynvml.nvmlDeviceGetComputeInstanceId(h)))
        except pynvml.NVMLError as exc:
            log.debug("GPU %d: MIG device %d: %s", dev.index, i, exc)
    return True, out
