"""The performance state (P0 most performance ... P15 least), fast tier: 2.4 us on an H200."""

from __future__ import annotations

from typing import Any

import pynvml


class PerformanceState:
    name = "performance_state"
    tier = "fast"

    def read(self, dev: Any) -> dict[str, Any]:
        state = dev.get("performance_state", pynvml.nvmlDeviceGetPerformanceState)
        # NVML_PSTATE_UNKNOWN (32) is no state: absent
        return {"performance_state": int(state)} if state is not None and 0 <= state <= 15 \
            else {}
