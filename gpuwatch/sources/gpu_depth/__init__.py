"""What NVML tells beyond the basics: one collector per file behind one small interface.

Each collector reads one device on its tier (`fast`: every tick, calls of a few
microseconds; `slow`: the slow interval) and returns the GpuSample fields it filled.
What a GPU does not support is remembered on the device (`dev.get`) and never asked again, so
an unsupported field costs one call for the daemon's lifetime.
"""

from __future__ import annotations

from typing import Any, Protocol


class Collector(Protocol):
    name: str
    tier: str  # fast | slow

    def read(self, dev: Any) -> dict[str, Any]:
        """The GpuSample fields this collector filled for `dev` (empty when unsupported)."""
        ...


def make_collectors() -> list[Collector]:
    """A fresh set for one device: some keep state between reads (GPM's previous sample)."""
    from gpuwatch.sources.gpu_depth.fabric import Fabric
    from gpuwatch.sources.gpu_depth.fields import FieldValues
    from gpuwatch.sources.gpu_depth.gpm import Gpm
    from gpuwatch.sources.gpu_depth.media import MediaEngines
    from gpuwatch.sources.gpu_depth.process_util import ProcessUtil
    from gpuwatch.sources.gpu_depth.pstate import PerformanceState
    from gpuwatch.sources.gpu_depth.settled import Settled
    from gpuwatch.sources.gpu_depth.thermal import Thermal, ThermalLimits

    return [Settled(), FieldValues(), Fabric(), Gpm(), ProcessUtil(), ThermalLimits(), Thermal(),
            PerformanceState(), MediaEngines()]
