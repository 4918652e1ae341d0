"""NVLink error totals, active links and the driver's recommended recovery action, from one
nvmlDeviceGetFieldValues call (it succeeds when any field filled: each value is checked)."""

from __future__ import annotations

from typing import Any

import pynvml

# field id -> (GpuSample field, key in nvlink_errors_total or None)
FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: ("nvlink_errors_total", "crc"),
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: ("nvlink_errors_total", "replay"),
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: ("nvlink_errors_total", "recovery"),
    pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: ("recovery_action", None),
}


def _value(v: Any) -> int:
    # c_nvmlValue_t is a union; these fields are unsigned integers.
    return int(v.value.ullVal if v.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
               else v.value.uiVal)


class FieldValues:
    name = "field_values"
    tier = "slow"

    def __init__(self) -> None:
        self.ids = list(FIELDS)

    def read(self, dev: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.ids:
            values = dev.get("field_values", pynvml.nvmlDeviceGetFieldValues, self.ids)
            if values is not None:
                unsupported = []
                for v in values:
                    field, key = FIELDS[v.fieldId]
                    if v.nvmlReturn != pynvml.NVML_SUCCESS:
                        if v.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED:
                            unsupported.append(v.fieldId)
                        continue
                    if key is None:
                        out[field] = _value(v)
                    else:
                        out.setdefault(field, {})[key] = _value(v)
                # Not asked again: the next call carries only what this GPU has.
                self.ids = [i for i in self.ids if i not in unsupported]
        links = self._active_links(dev)
        if links is not None:
            out["nvlink_links_active"] = links
        return out

    @staticmethod
    def _active_links(dev: Any) -> int | None:
        """Links up; a GPU without NVLink says NotSupported on link 0 and is never asked
        again. Later links that are absent end the count."""
        active = 0
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            state = dev.get("nvlink_state" if link == 0 else f"nvlink_state_{link}",
                            pynvml.nvmlDeviceGetNvLinkState, link)
            if state is None:
                if link == 0:
                    return None
                break
            active += 1 if state else 0
        return active
