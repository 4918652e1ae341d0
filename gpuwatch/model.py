"""What one tick of sampling looks like.

These structs are the recording format (DESIGN.md §2): the daemon writes them, replay reads
them back, and the analyzers consume nothing else. Optional fields are omitted from the
recording when unknown, so "absent" never reads as zero.
"""

from __future__ import annotations

import msgspec

# ProcessSample fields that say who runs the process: labels of every process series and
# fields of its events.
ATTRIBUTION_FIELDS = ("namespace", "pod", "container", "slurm_job_id")


class ProcessSample(msgspec.Struct, omit_defaults=True, kw_only=True):
    pid: int
    name: str = ""
    used_memory_bytes: int | None = None
    create_time: float | None = None
    user: str = ""
    # compute | graphics | mps (a pid can appear in several lists; compute wins)
    type: str = "compute"
    # Who runs it (gpuwatch.attribution), "" when unknown.
    pod: str = ""
    namespace: str = ""
    container: str = ""
    slurm_job_id: str = ""
    # allow-listed pod labels and annotations ([attribution.kubelet], [..kubernetes_api])
    pod_labels: dict[str, str] = {}
    pod_annotations: dict[str, str] = {}
    # The host's view of it (psutil, refreshed every few seconds): CPU time (user + system),
    # its share of one core since the previous reading, and resident memory.
    cpu_seconds_total: float | None = None
    cpu_ratio: float | None = None
    resident_memory_bytes: int | None = None


class ProcessUtilization(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One process's share of a GPU over the last sample period (time-sliced sharing)."""

    pid: int
    sm_ratio: float | None = None
    memory_ratio: float | None = None
    encoder_ratio: float | None = None
    decoder_ratio: float | None = None


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
    # HBM temperature (field NVML_FI_DEV_MEMORY_TEMP); absent on boards without a sensor
    memory_temperature_celsius: float | None = None
    memory_temperature_max_celsius: float | None = None  # slow tier: the slowdown threshold
    # fan 0's intended speed, 0-1; absent where the board has no fans (SXM, passive)
    fan_speed_ratio: float | None = None
    performance_state: int | None = None  # P-state: 0 (P0, most performance) to 15
    # media engines' utilization over NVML's own sampling period, 0-1
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    jpeg_utilization_ratio: float | None = None
    ofa_utilization_ratio: float | None = None
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
    # when each XID code was last seen (wall time of the sample that drained it)
    xid_last_seen: dict[str, float] = {}
    # slow tier
    energy_joules_total: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    # MIG: a physical GPU says whether MIG is on; each MIG instance is sampled as a GPU of its
    # own (its "MIG-..." uuid, its own memory and processes) that names its parent.
    mig_mode: bool | None = None
    mig_parent_uuid: str = ""
    mig_instance: str = ""  # "gi<G>/ci<C>"
    mig_profile: str = ""  # "1g.10gb"
    # GPM (Hopper and newer), over the slow tier's interval: ratios 0-1, bytes per second.
    gpm_sm_active_ratio: float | None = None
    gpm_sm_occupancy_ratio: float | None = None
    gpm_tensor_active_ratio: float | None = None
    gpm_dram_bandwidth_ratio: float | None = None
    gpm_pcie_tx_bytes_per_second: float | None = None
    gpm_pcie_rx_bytes_per_second: float | None = None
    gpm_nvlink_tx_bytes_per_second: float | None = None
    gpm_nvlink_rx_bytes_per_second: float | None = None
    # NVLink, fabric and the driver's recommended recovery action (slow tier).
    nvlink_links_active: int | None = None
    nvlink_errors_total: dict[str, int] = {}  # crc | replay | recovery, summed over links
    fabric_state: str = ""  # not_started | in_progress | completed
    fabric_healthy: bool | None = None
    recovery_action: int | None = None  # nvmlDeviceGpuRecoveryAction_t
    process_utilization: list[ProcessUtilization] = []
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
    # What the engine's info endpoint says (sources/engine_info.py): version, model.
    info: dict[str, str] = {}


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


class OomSample(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A process's OOM, from the record its probe kept (gpuwatch.probe_channel.oom), as the
    daemon adopted it: on the tick it was adopted, once."""

    pid: int
    t: float  # the first failed request
    seq: int = 0  # the record's number in its process
    create_time: float | None = None
    gpu_uuid: str | None = None
    device: int | None = None
    # who it was, as NVML and attribution last saw the process ("" when unknown)
    name: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""
    slurm_job_id: str = ""
    request_bytes: int | None = None
    device_free_bytes: int | None = None
    device_total_bytes: int | None = None
    allowed_bytes: int | None = None
    reserved_bytes: int | None = None
    allocated_bytes: int | None = None
    cached_free_bytes: int | None = None  # free blocks inside the allocator's segments
    largest_free_block_bytes: int | None = None
    fragmentation_ratio: float | None = None
    # reserved bytes per allocator pool: "default", and private pools (CUDA graphs) apart
    pools: dict[str, int] = {}
    observer_calls: int = 1
    cause: str = ""  # full | fragmentation | limit
    outcome: str = ""  # raised | caught | recovered | unknown | pending
    exited: bool = False  # the process was gone when the record was adopted
    capture_seconds: float | None = None
    record: str = ""  # the adopted record's path in the snapshot directory
    history: str = ""  # the adopted allocation-history pickle, when there was one
    problem: str = ""  # why a part could not be adopted


class Tick(msgspec.Struct, omit_defaults=True, kw_only=True):
    t: float
    gpus: list[GpuSample] = []
    engines: list[EngineSample] = []
    probes: list[ProbeSample] = []
    ooms: list[OomSample] = []
    # Engine scrapes as they arrive, between the host's ticks: only the engine analyzer
    # reads them (no GPU was sampled: an empty list here says nothing about the GPUs).
    engines_only: bool = False


class RecordingHeader(msgspec.Struct, kw_only=True):
    format: str = "gpuwatch-recording"
    version: int = 1
    host: str = ""
    interval_s: float = 2.0
