"""Signal parameters (leak, life cycle, zone, time to OOM, fragmentation, engine signals).

Thresholds themselves (leak slopes, zone starts, fragmentation limits, headroom) come from
the versioned threshold table; a value set here overrides the table's for this host.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]
Share = Annotated[float, msgspec.Meta(ge=0, lt=1)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]

# Per engine endpoint: sample lines of the metrics gpuwatch reads kept from one scrape (a real
# engine has a few hundred), series groups (data-parallel ranks, Triton models) tracked, how
# many scrapes a group may be absent before it is forgotten, failed scrapes before engine_down,
# and how long an engine that sends nothing is kept. Engine and discovery settings default to
# these; the engine analyzer falls back on them (EngineLimits) without a configuration.
DEFAULT_MAX_SERIES = 20_000
DEFAULT_MAX_SERIES_GROUPS = 512
DEFAULT_FORGET_GROUP_AFTER_SCRAPES = 60
DEFAULT_DOWN_AFTER_FAILURES = 2
DEFAULT_FORGET_ENGINE_AFTER_SECONDS = 120.0


class Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class LifecycleConfig(Section, kw_only=True):
    """Spec §3: loading -> warm-up -> steady. Before steady only fast sustained growth is
    judged (LeakConfig.early_*)."""

    # Growth pauses this long (no new high): loading is over, warm-up begins.
    loading_settle_seconds: PositiveFloat = 30.0
    # A rise counts as a new high above max(new_high_bytes, new_high_ratio x the old high).
    new_high_bytes: NonNegFloat = 64 * 2**20
    new_high_ratio: Ratio = 0.01
    # Retained memory (the leak floor) has not risen by more than settle_bytes for this
    # long, and warm-up has lasted one floor window: steady.
    warmup_settle_seconds: PositiveFloat = 180.0
    settle_bytes: NonNegFloat = 64 * 2**20
    # Steady at the latest this long after the process started, whatever the memory does.
    warmup_max_seconds: PositiveFloat = 900.0
    # A fall below this share of the steady floor is a reload: back to loading.
    reload_drop_ratio: Ratio = 0.5
    # A process missing from this many seconds of samples is gone (state dropped).
    forget_after_seconds: PositiveFloat = 60.0
    # An engine that woke from sleep takes its memory back: its series hold this long.
    wake_settle_seconds: NonNegFloat = 60.0


class LeakConfig(Section, kw_only=True):
    enabled: bool = True
    # Slopes (bytes/s); unset: the threshold table's (12 MiB/min and 50 MiB/s in v2.3.1).
    warning_bytes_per_second: PositiveFloat | None = None
    critical_bytes_per_second: PositiveFloat | None = None
    # A robust slope this close below a threshold counts as reaching it.
    tolerance: Share = 0.1
    # A sustained trend fires once it has held this long (a transient that outlasts the
    # floor window lifts the floor for a few minutes at most).
    confirm_seconds: NonNegFloat = 240.0
    # Exit level and minimum hold: a warning falls back once the retained-memory trend has
    # stayed below resolve_ratio x its slope for resolve_seconds; a critical once the raw
    # lower envelope rose less than resolve_ratio x its slope on average over the last
    # critical_resolve_seconds (no floor-window lag; sawtooth cannot hold it open).
    resolve_ratio: Ratio = 0.5
    resolve_seconds: NonNegFloat = 600.0
    critical_resolve_seconds: NonNegFloat = 300.0
    # Retained memory: the minimum over floor_window, sampled once per bucket.
    bucket_seconds: PositiveFloat = 60.0
    floor_window_seconds: PositiveFloat = 300.0
    # Theil-Sen slope of the retained memory over this window ...
    trend_window_seconds: PositiveFloat = 1440.0
    # ... judged once it spans at least this much steady time, and only when the retained
    # memory rose in both halves of the window by at least this share of the threshold.
    min_trend_seconds: PositiveFloat = 1440.0
    sustained_ratio: Ratio = 0.4
    # ... and by at least this share of the trend judged (a trend carried by one half is a
    # transient that has not come back down).
    trend_share: Ratio = 0.3
    # ... and the second half rose at least this share of the first (warm-up levels off).
    levelling_ratio: Ratio = 0.4
    # A warning is also held while the retained memory rose over this longer window
    # (unset: the trend window's).
    exit_window_seconds: PositiveFloat | None = None
    # The GPU's series when the driver gives no per-process figures and it sums several
    # processes: its floor wanders with the beat of their sawtooths (by up to their
    # amplitude, over tens of minutes to hours) and their transients chain, so its floor
    # and trend windows are this many times longer, and a warning is held on twice its
    # trend window.
    sum_window_factor: Annotated[float, msgspec.Meta(ge=1)] = 2.0
    # Fast path for the critical slope: the raw samples of this window, in quarters.
    critical_window_seconds: PositiveFloat = 40.0
    # Before steady (loading, warm-up), growth is judged critical when the minima of each
    # of early_parts parts of a full early_window climb at the critical slope, once the
    # lower envelope has paused for early_pause_seconds since the process started (loading
    # is over), and the growth would spend the GPU's budget within early_horizon_seconds.
    early_window_seconds: PositiveFloat = 50.0
    early_parts: Annotated[int, msgspec.Meta(ge=2)] = 5
    early_pause_seconds: PositiveFloat = 20.0
    early_horizon_seconds: PositiveFloat = 7200.0
    # Each process's series takes a sample at most this often, whatever the tick: the rate
    # the detector is tuned and benchmarked at. Faster ticks add nothing to its judgement
    # but cost (8 GPUs x 64 processes at 1 s); 0 takes every tick. Never thinner than a
    # dozen samples per critical window and three per part of the early window.
    sample_interval_seconds: NonNegFloat = 3.0
    # Per process, follow the probe's allocator reserved bytes instead of NVML's figure.
    prefer_probe: bool = True
    probe_max_age_seconds: PositiveFloat = 30.0
    lifecycle: LifecycleConfig = msgspec.field(default_factory=LifecycleConfig)


class ZoneConfig(Section, kw_only=True):
    enabled: bool = True
    # Leave a zone only this share of total memory below where it starts.
    hysteresis_ratio: Share = 0.02
    # Enter a higher zone after this many consecutive samples in it.
    enter_samples: Annotated[int, msgspec.Meta(ge=1)] = 2
    # Leave a zone only after being below its exit level this long (minimum hold).
    hold_seconds: NonNegFloat = 60.0
    # Recognise engines' pre-allocated pools (vLLM gpu_memory_utilization) as planned.
    planned_pools: bool = True
    # vLLM's own default, for an engine that does not publish cache_config_info.
    vllm_default_utilization: Ratio = 0.9


class TimeToOomConfig(Section, kw_only=True):
    enabled: bool = True
    # A detected leak whose time to OOM falls under these horizons raises time_to_oom
    # (and makes the leak critical under the critical horizon).
    critical_seconds: PositiveFloat = 1800.0
    warning_seconds: PositiveFloat = 7200.0
    # Resolve only once the time to OOM is this factor above the horizon.
    resolve_factor: Annotated[float, msgspec.Meta(ge=1)] = 1.2
    # ... and that has held this long (minimum hold of a level).
    hold_seconds: NonNegFloat = 120.0


class FragmentationSignalConfig(Section, kw_only=True):
    enabled: bool = True
    # Overrides of the table's limits (spec §4, 3 consecutive samples); unset: the table's.
    consecutive_samples: Annotated[int, msgspec.Meta(ge=1)] | None = None
    largest_free_share_min: Ratio | None = None
    free_blocks_per_mb_max: PositiveFloat | None = None
    smallest_free_block_min_bytes: NonNegFloat | None = None
    act_when_free_below_bytes: NonNegFloat | None = None
    fragmentation_ratio_max: Ratio | None = None


class KvCacheSignalConfig(Section, kw_only=True):
    """KV-cache (prefix-cache) hit ratio = increase(hits) / increase(queries) over a window."""

    window_seconds: PositiveFloat = 300.0
    # A warning fires when the windowed hit ratio falls below this floor. Off (0) by
    # default: what a good ratio is depends entirely on the workload's shared prefixes.
    floor: Ratio = 0.0
    # Critical below this (0: no critical level).
    critical_floor: Ratio = 0.0
    # Judge only windows with at least this many queries (tokens, or blocks for engines
    # that count blocks), so a handful of requests cannot fire the event.
    min_queries: NonNegFloat = 1000.0

    def __post_init__(self) -> None:
        if self.critical_floor and self.floor and self.critical_floor > self.floor:
            raise ValueError("critical_floor: must not be above floor")


class QueueSignalConfig(Section, kw_only=True):
    """Queue latency quantiles over a window, from the engine's queue-time histogram."""

    window_seconds: PositiveFloat = 300.0
    quantiles: list[float] = msgspec.field(default_factory=lambda: [0.5, 0.95, 0.99])
    # The quantile judged against the SLO.
    slo_quantile: float = 0.95
    # A warning fires when that quantile exceeds this many seconds (0: off).
    slo_seconds: NonNegFloat = 5.0
    # Critical above this (0: no critical level).
    critical_seconds: NonNegFloat = 0.0
    # Judge only windows in which at least this many requests left the queue.
    min_requests: NonNegFloat = 10.0
    # Engines without a queue-time histogram (Triton) expose only total queue time and a
    # request count; judge their windowed mean against the SLO instead (said in the event).
    judge_mean_without_histogram: bool = True

    def __post_init__(self) -> None:
        for q in (*self.quantiles, self.slo_quantile):
            if not 0 < q < 1:
                raise ValueError(f"quantiles: {q} is not strictly between 0 and 1")
        if self.critical_seconds and self.slo_seconds and self.critical_seconds < self.slo_seconds:
            raise ValueError("critical_seconds: must not be below slo_seconds")


class EngineLimits(Section, kw_only=True):
    """What the engine analyzer reads of an engine's (or discovery's) settings, with their
    defaults: the analyzer takes any object with these attributes."""

    max_series: PositiveInt = DEFAULT_MAX_SERIES
    max_series_groups: PositiveInt = DEFAULT_MAX_SERIES_GROUPS
    forget_group_after_scrapes: PositiveInt = DEFAULT_FORGET_GROUP_AFTER_SCRAPES
    down_after_failures: PositiveInt = DEFAULT_DOWN_AFTER_FAILURES
    forget_after_seconds: PositiveFloat = DEFAULT_FORGET_ENGINE_AFTER_SECONDS


class SignalsConfig(Section, kw_only=True):
    leak: LeakConfig = msgspec.field(default_factory=LeakConfig)
    zone: ZoneConfig = msgspec.field(default_factory=ZoneConfig)
    time_to_oom: TimeToOomConfig = msgspec.field(default_factory=TimeToOomConfig)
    fragmentation: FragmentationSignalConfig = msgspec.field(
        default_factory=FragmentationSignalConfig
    )
    kv_cache: KvCacheSignalConfig = msgspec.field(default_factory=KvCacheSignalConfig)
    queue: QueueSignalConfig = msgspec.field(default_factory=QueueSignalConfig)
