"""What one tick of sampling looks like.

These structs are the recording format (DESIGN.md §2): the daemon writes them, replay reads
them back, and the analyzers consume nothing else. Optional fields are omitted from the
recording when unknown, so "absent" never reads as zero.
"""

from __future__ import annotations

import msgspec


class ProcessSample(msgspec.Struct, omit_defaults=True, kw_only=True):
    pid: int
    name: str = ""
    used_memory_bytes: int | None = None
    create_time: float | None = None
    user: str = ""
    # compute | graphics | mps (a pid can appear in several lists; compute wins)
    type: str = "compute"
    pod: str = ""
    namespace: str = ""
    container: str = ""


class GpuSample(msgspec.Struct, omit_defaults=True, kw_only=True):
    index: int
    uuid: str
    name: str = ""
    pci_bus_id: str = ""
    lost: bool = False
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    clocks_event_reasons: int | None = None
    ecc_volatile_corrected_total: int | None = None
    ecc_volatile_uncorrected_total: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # XID counts since the daemon started, by XID code (as a string key for JSON).
    xid_events_total: dict[str, int] = {}
    last_xid: int | None = None
    # slow tier
    energy_joules_total: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    processes: list[ProcessSample] = []


class EngineSample(msgspec.Struct, omit_defaults=True, kw_only=True, dict=True):
    """One scrape of an inference engine's /metrics, kept raw so replay re-parses it.

    (dict=True: the live source may attach what it read off the event loop as `reading`;
    undeclared attributes are never encoded, so the recording holds only the text.)
    """

    name: str
    kind: str = "auto"
    url: str = ""
    exposition: str | None = None
    error: str | None = None
    t: float | None = None
    duration_seconds: float | None = None
    pids: list[int] = []


class ProbeSample(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Allocator state published by gpuwatch.probe inside a PyTorch process."""

    pid: int
    t: float | None = None
    device: int | None = None
    # NVML's UUID of the device as CUDA reports it (survives CUDA_VISIBLE_DEVICES reordering)
    gpu_uuid: str | None = None
    create_time: float | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    inactive_split_bytes: int | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None
    free_blocks: int | None = None
    largest_free_block_bytes: int | None = None
    smallest_free_block_bytes: int | None = None
    total_free_bytes: int | None = None
    segments: int | None = None


class Tick(msgspec.Struct, omit_defaults=True, kw_only=True):
    t: float
    gpus: list[GpuSample] = []
    engines: list[EngineSample] = []
    probes: list[ProbeSample] = []


class RecordingHeader(msgspec.Struct, kw_only=True):
    format: str = "gpuwatch-recording"
    version: int = 1
    host: str = ""
    interval_s: float = 2.0
