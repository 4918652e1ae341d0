"""The media engines' utilization (encoder, decoder, JPEG, optical flow), fast tier.

Each call answers [percent, NVML's sampling period in us]; 2.6-3.9 us each on an H200. A
GPU without an engine says NotSupported once and is not asked again.
"""

from __future__ import annotations

from typing import Any

import pynvml

# GpuSample field -> NVML call (a missing wrapper in an older nvidia-ml-py: not asked)
ENGINES = {
    "encoder_utilization_ratio": "nvmlDeviceGetEncoderUtilization",
    "decoder_utilization_ratio": "nvmlDeviceGetDecoderUtilization",
    "jpeg_utilization_ratio": "nvmlDeviceGetJpgUtilization",
    "ofa_utilization_ratio": "nvmlDeviceGetOfaUtilization",
}


class MediaEngines:
    name = "media_engines"
    tier = "fast"

    def __init__(self) -> None:
        self.calls = {f: getattr(pynvml, fn) for f, fn in ENGINES.items()
                      if hasattr(pynvml, fn)}

    def read(self, dev: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field, fn in self.calls.items():
            got = dev.get(field, fn)
            if got is not None:
                out[field] = min(int(got[0]), 100) / 100.0
        return out
