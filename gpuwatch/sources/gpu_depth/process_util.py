"""Per-process SM, memory, encoder and decoder utilization (time-sliced sharing), from
nvmlDeviceGetProcessUtilization since the last read."""

from __future__ import annotations

from typing import Any

import pynvml

from gpuwatch.model import ProcessUtilization


class ProcessUtil:
    name = "process_utilization"
    tier = "slow"

    def __init__(self) -> None:
        self._since_us = 0  # NVML's own timestamps: only samples newer than the last read

    def read(self, dev: Any) -> dict[str, Any]:
        if "process_utilization" in dev.unsupported:
            return {}
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(dev.handle, self._since_us)
        except pynvml.NVMLError_NotFound:
            return {"process_utilization": []}  # no process ran since the last read
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
            dev.unsupported.add("process_utilization")
            return {}
        except pynvml.NVMLError:
            return {}
        latest: dict[int, Any] = {}
        for s in samples:
            self._since_us = max(self._since_us, int(s.timeStamp))
            if s.pid not in latest or s.timeStamp > latest[s.pid].timeStamp:
                latest[s.pid] = s
        return {"process_utilization": [
            ProcessUtilization(pid=int(s.pid), sm_ratio=s.smUtil / 100.0,
                               memory_ratio=s.memUtil / 100.0,
                               encoder_ratio=s.encUtil / 100.0,
                               decoder_ratio=s.decUtil / 100.0)
            for _, s in sorted(latest.items())]}
