"""The interface every GPU backend (real NVML, simulation) implements."""

from __future__ import annotations

from typing import Protocol

from gpuwatch.model import GpuSample, ProbeSample


class BackendUnavailable(Exception):
    """The backend cannot sample at all right now (no library, no driver); retried later."""


class GpuBackend(Protocol):
    name: str
    driver_version: str

    def open(self) -> None:
        """Initialise; raise BackendUnavailable with a reason when it cannot."""

    def sample(self, now: float) -> list[GpuSample]:
        """The fast tier: one GpuSample per GPU, processes included."""

    def sample_slow(self, now: float) -> dict[str, dict]:
        """The slow tier (energy, PCIe): GpuSample field values by GPU uuid."""

    def probes(self, now: float) -> list[ProbeSample] | None:
        """Probe records the backend produces itself (simulation); None: read the directory."""

    def close(self) -> None: ...
