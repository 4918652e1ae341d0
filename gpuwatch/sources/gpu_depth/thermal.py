"""Fans and HBM temperature (fast tier), and the HBM slowdown threshold (asked once).

Measured on an H200: the memory-temperature field 13 us, the threshold 240 us (so it is read
once: it does not change), fan speed NotSupported (an SXM board has no fans: absent, never 0).
"""

from __future__ import annotations

from typing import Any

import pynvml

MEMORY_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP


def _field(handle: Any, field_id: int) -> int:
    """One field value; raises NotSupported as a plain call would."""
    (v,) = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])
    if v.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(v.nvmlReturn)
    return int(v.value.ullVal if v.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
               else v.value.uiVal)


class Thermal:
    name = "thermal"
    tier = "fast"

    def read(self, dev: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        temp = dev.get("memory_temperature", _field, MEMORY_TEMP)
        if temp is not None and 0 < temp < 200:  # a board without a sensor may answer 0
            out["memory_temperature_celsius"] = float(temp)
        fan = dev.get("fan_speed", pynvml.nvmlDeviceGetFanSpeed)
        if fan is not None:
            out["fan_speed_ratio"] = min(fan, 100) / 100.0
        return out


class ThermalLimits:
    name = "thermal_limits"
    tier = "slow"

    def __init__(self) -> None:
        self.memory_max: float | None = None
        self.asked = False

    def read(self, dev: Any) -> dict[str, Any]:
        if not self.asked:
            value = dev.get("memory_temperature_max", pynvml.nvmlDeviceGetTemperatureThreshold,
                            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
            # a failure this time is asked again; an answer (or NotSupported) is kept
            self.asked = value is not None or "memory_temperature_max" in dev.unsupported
            if value is not None and 0 < value < 200:
                self.memory_max = float(value)
        return {} if self.memory_max is None else {
            "memory_temperature_max_celsius": self.memory_max}
