"""Fabric state and health (Hopper and newer, nvmlDeviceGetGpuFabricInfoV)."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml

STATES = {
    pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not_started",
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in_progress",
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
}


def _info(handle: Any) -> Any:
    info = pynvml.c_nvmlGpuFabricInfo_v2_t()
    info.version = pynvml.nvmlGpuFabricInfo_v2
    pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    return info


def judge(state: int, status: int, health_mask: int) -> tuple[str, bool | None]:
    """(state name, healthy): healthy once registration completed without error and the
    fabric reports no degraded bandwidth; None while it is still registering."""
    name = STATES.get(state, "")
    if state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        return name, None
    degraded = ((health_mask >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW)
                & pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW)
    healthy = (status == pynvml.NVML_SUCCESS
               and degraded != pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE)
    return name, healthy


class Fabric:
    name = "fabric"
    tier = "slow"

    def read(self, dev: Any) -> dict[str, Any]:
        info = dev.get("fabric", _info)
        if info is None:
            return {}
        if info.state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            dev.unsupported.add("fabric")  # a GPU outside an NVLink fabric says so for good
            return {}
        state, healthy = judge(info.state, info.status, getattr(info, "healthMask", 0))
        out: dict[str, Any] = {"fabric_state": state}
        if healthy is not None:
            out["fabric_healthy"] = healthy
        return out
