"""What gpuwatch knows about one engine: derived.engines[name].

Plain fields only (it is rendered as JSON in /api/state). None means unknown, and
`missing` says why for every normalized series that is absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineState:
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
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
