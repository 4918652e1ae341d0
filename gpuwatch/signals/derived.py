"""What the analyzers conclude, per GPU, process and engine; read by the outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwatch.signals.budget import Selection


@dataclass
class GpuSignals:
    leak_rate_bytes_per_second: float | None = None
    # +Inf unless the GPU's retained memory rises (projected) or a leak is judged on it;
    # 0 when past its budget and still growing.
    time_to_oom_seconds: float | None = None
    # Budget less used memory and the pools engines will take (negative: over budget).
    headroom_bytes: float | None = None
    # The daemon's leak verdict for the GPU's own series: 0 none, 1 warning, 2 critical.
    leak_severity: int | None = None
    # The daemon's time-to-OOM verdict: 0 none, 1 warning, 2 critical (horizons).
    time_to_oom_severity: int | None = None
    zone: int | None = None  # 0 safe, 1 warning, 2 critical
    # zone name -> bytes where that zone starts (warning, critical), plus "budget"
    thresholds: dict[str, float] = field(default_factory=dict)
    threshold_row: str = ""
    threshold_calibrated: bool | None = None
    # Memory the zone judged (used minus planned pools such as a vLLM KV cache).
    unplanned_memory_bytes: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class ProcessSignals:
    leak_rate_bytes_per_second: float | None = None
    time_to_oom_seconds: float | None = None
    leak_severity: int | None = None  # the daemon's verdict: 0 none, 1 warning, 2 critical
    fragmentation_ratio: float | None = None
    # Free-block count per MB of free memory (spec §4), from the probe's snapshot.
    free_blocks_per_mb: float | None = None
    largest_free_share: float | None = None
    # NVML used minus allocator reserved (driver context, non-PyTorch allocations).
    unattributed_bytes: float | None = None
    phase: str = ""  # loading | warmup | steady | ""
    notes: list[str] = field(default_factory=list)


@dataclass
class ModelSlis:
    """The serving SLIs of one model of an engine; an EngineState has them for the engine as
    a whole (signals/slis.py fills both)."""

    sli_quantiles_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    # quantile labels given by the engine itself (Triton's summaries), not gpuwatch's window
    sli_quantiles_from_engine: dict[str, list[str]] = field(default_factory=dict)
    sli_below_resolution: dict[str, list[str]] = field(default_factory=dict)
    sli_resolution_seconds: dict[str, float] = field(default_factory=dict)
    sli_mean_seconds: dict[str, float] = field(default_factory=dict)
    sli_requests_total: dict[str, float] = field(default_factory=dict)
    sli_seconds_total: dict[str, float] = field(default_factory=dict)
    sli_buckets: dict[str, list[float]] = field(default_factory=dict)
    sli_requests_in_window: dict[str, float] = field(default_factory=dict)
    sli_source: dict[str, str] = field(default_factory=dict)
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    requests_finished_total: dict[str, float] = field(default_factory=dict)
    client_requests_total: dict[str, float] = field(default_factory=dict)
    request_error_ratio: float | None = None
    request_error_ratios: dict[str, float] = field(default_factory=dict)
    requests_waiting_by_reason: dict[str, float] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class EngineState(ModelSlis):
    """What gpuwatch knows about one engine: rendered as JSON in /api/state. None means
    unknown, and `missing` says why for every normalized series that is absent. Its serving
    SLIs as a whole are the fields it shares with ModelSlis."""

    name: str
    url: str = ""
    kind: str = ""  # vllm | sglang | tgi | llamacpp | triton ('' until recognized)
    # Which metric generation was read: v1 | v1-legacy | v0 (vLLM), triton-trtllm, ...
    generation: str = ""
    model: str = ""
    up: bool = False
    reason: str = ""  # why down
    pids: list[int] = field(default_factory=list)
    gpus: dict[str, int] = field(default_factory=dict)  # uuid -> index, via NVML's pids
    # Labels of vllm:cache_config_info (block_size, num_gpu_blocks, gpu_memory_utilization...)
    cache_config: dict[str, str] = field(default_factory=dict)
    # Memory facts for the memory analyzer (signals/pools.py): sleep level (0 awake, 1
    # weights offloaded, 2 all discarded; None unknown), when it last changed, how often it
    # went to sleep, and the planned KV pool in tokens and, where the engine says, bytes.
    sleep_level: int | None = None
    sleep_changed_at: float | None = None
    sleeps_total: int = 0
    kv_pool_tokens: float | None = None
    kv_pool_bytes: float | None = None
    last_scrape: float | None = None
    last_success: float | None = None
    scrape_duration_seconds: float | None = None
    consecutive_failures: int = 0
    ranks: int = 0  # data-parallel engine cores / Triton models summed into this engine
    # Gauges, as of the last successful scrape.
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage_ratio: float | None = None
    # Counters: the engine's own values plus, after a restart, what it had counted before.
    prefix_cache_hits_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_unit: str = ""  # tokens | blocks
    preemptions_total: float | None = None
    # Requests that left the queue and their total queue time (from the histogram's _count
    # and _sum, or Triton's counters), kept monotonic like the counters above.
    queue_requests_total: float | None = None
    queue_seconds_total: float | None = None
    restarts_detected: int = 0
    # Processes answering at the URL: 2 or more when process_start_time_seconds alternates
    # between them (replicas behind one address; reason says so while up). 0 while down.
    replicas: int = 0
    series_groups: int = 0  # counter groups tracked (ranks, models), bounded
    limit: str = ""  # which bound this engine's exposition hit, if any
    # Windowed signals.
    kv_cache_hit_ratio: float | None = None
    kv_cache_hit_ratio_source: str = ""  # window | engine
    kv_cache_queries_in_window: float | None = None
    queue_latency_seconds: dict[str, float] = field(default_factory=dict)  # quantile -> s
    queue_latency_mean_seconds: float | None = None
    queue_requests_in_window: float | None = None
    preemption_rate_per_second: float | None = None
    # Its serving SLIs as a whole are ModelSlis's fields (signals/slis.py).
    # Per model, where the engine serves several in one process (Triton); else empty and
    # the fields above are its one model's.
    models: dict[str, ModelSlis] = field(default_factory=dict)
    models_loaded: int | None = None  # None: the engine does not say (it serves one)
    version: str = ""  # from the engine's version endpoint, where it has one
    # Restarts seen so far as published: never decreases, unlike restarts_detected.
    restarts_total: int = 0
    # Counters going backwards more than once a window without a start time to tell
    # processes apart: several processes behind the URL, or a crash loop. Nothing is
    # derived from its counters while it lasts.
    ambiguous: bool = False
    # The engine's own families gpuwatch does not read (bounded): a new version's additions.
    unread_families: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class EngineMemory:
    """An engine's processes on one GPU: NVML's figure beside the plan the engine publishes
    (signals/engine_memory.py); None where it says nothing, not_exposed says what it keeps
    to itself."""

    engine: str
    kind: str = ""
    gpu_uuid: str = ""
    gpu_index: int | None = None
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> NVML used bytes
    nvml_used_bytes: float | None = None
    planned_bytes: float | None = None  # the share of the GPU it may take
    planned_source: str = ""
    kv_cache_bytes: float | None = None
    kv_cache_tokens: float | None = None
    # NVML used minus the KV cache: weights, activations, CUDA graphs, context, together
    other_bytes: float | None = None
    not_exposed: dict[str, str] = field(default_factory=dict)  # part -> where it is said


@dataclass
class OomTally:
    """A process's OOMs on one GPU (signals/process_oom.py), kept a while after it exited so
    that its counter is scraped and its alert resolves."""

    gpu_index: int | None = None
    name: str = ""
    owner: dict[str, str] = field(default_factory=dict)  # attribution labels known
    create_time: float | None = None
    counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (cause, outcome) -> n
    last_t: float = 0.0
    # seconds between the first leak / time-to-OOM event and the last OOM; None: unpredicted
    last_lead_seconds: float | None = None


@dataclass
class Derived:
    gpus: dict[str, GpuSignals] = field(default_factory=dict)  # by uuid
    processes: dict[tuple[str, int], ProcessSignals] = field(default_factory=dict)
    engines: dict[str, EngineState] = field(default_factory=dict)  # by engine name
    threshold_table: dict[str, str] = field(default_factory=dict)  # version, source
    # OOMs: per (uuid, pid), per GPU uuid, and the last process_oom events (newest last)
    ooms: dict[tuple[str, int], OomTally] = field(default_factory=dict)
    gpu_ooms: dict[str, int] = field(default_factory=dict)
    recent_ooms: list = field(default_factory=list)
    engine_memory: list[EngineMemory] = field(default_factory=list)
    # which processes have series of their own (signals/budget.py)
    budget: Selection = field(default_factory=Selection)

    # get first: these run for every process on every tick, and most already exist
    def gpu(self, uuid: str) -> GpuSignals:
        sig = self.gpus.get(uuid)
        if sig is None:
            sig = self.gpus[uuid] = GpuSignals()
        return sig

    def process(self, uuid: str, pid: int) -> ProcessSignals:
        sig = self.processes.get((uuid, pid))
        if sig is None:
            sig = self.processes[(uuid, pid)] = ProcessSignals()
        return sig
