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
    """Spec §3: loading -> warm-up -> steady, recognised by the memory's shape
    (signals/leak/lifecycle.py)."""

    # Loading is over once the retained memory, having grown by 4 x settle_bytes, stays
    # within pause_bytes this long: the first pause. Strict: a warm-up that levels off
    # slowly has not paused while it still climbs a few MiB a second.
    loading_settle_seconds: PositiveFloat = 30.0
    pause_bytes: NonNegFloat = 16 * 2**20
    settle_bytes: NonNegFloat = 64 * 2**20
    # The steep part of loading is over once the lower envelope (the minimum over half of
    # this) stays within settle_bytes this long: the critical path judges from then (a
    # slower climb after it does not matter at the critical slope).
    steep_pause_seconds: PositiveFloat = 20.0
    # ... or climbs no faster than this share of the critical slope (an allocator sawtooth
    # that starts as the load ends never stays flat, but it is no steep load).
    steep_pause_share: Ratio = 0.25
    # A series first seen holding more than this has loaded before it was seen (a daemon
    # started on a busy host, a process found after its load): its first pause ends loading
    # without growth seen first. A CUDA context alone holds 0.3-0.8 GiB, and a process
    # first seen with only that may still be about to load.
    found_loaded_bytes: NonNegFloat = 2**30
    # Growth before the first pause is taken for loading this long after the start; past
    # it, growth that keeps a steady pace is judged (a smooth load of 3 min is not).
    loading_max_seconds: PositiveFloat = 300.0
    # Retained memory has not risen by settle_bytes for this long after loading: steady.
    warmup_settle_seconds: PositiveFloat = 180.0
    # Steady at the latest this long after the process started (a process found older
    # is steady at once).
    warmup_max_seconds: PositiveFloat = 900.0
    # A sample below this share of the retained memory after loading is a reload.
    reload_drop_ratio: Ratio = 0.5
    # A process missing from this many seconds of samples is gone (state dropped).
    forget_after_seconds: PositiveFloat = 60.0
    # An engine that woke from sleep takes its memory back: its series hold this long.
    wake_settle_seconds: NonNegFloat = 60.0


def _default_scales() -> list[float]:
    return [60.0, 120.0, 150.0, 300.0, 600.0, 1440.0]


class LeakConfig(Section, kw_only=True):
    enabled: bool = True
    # Slopes (bytes/s); unset: the threshold table's (12 MiB/min and 50 MiB/s in v2.3.1).
    warning_bytes_per_second: PositiveFloat | None = None
    critical_bytes_per_second: PositiveFloat | None = None
    # A rate this close below a threshold counts as reaching it.
    tolerance: Share = 0.1
    # Retained memory (signals/leak/floor.py): the lowest block value over a floor window
    # as long as the series' own return period (the longest seen over return_memory_seconds),
    # within one block and max_floor_window_seconds; a return comes back within the
    # series' tolerance (3 x its typical block-to-block change, at least this).
    block_seconds: PositiveFloat = 15.0
    max_floor_window_seconds: PositiveFloat = 900.0
    return_memory_seconds: PositiveFloat = 3600.0
    floor_tolerance_bytes: NonNegFloat = 16 * 2**20
    # Time scales judged at once (signals/leak/scales.py): a scale shows a leak when the
    # retained memory rose over it by the warning slope, by min_rise_bytes, and by
    # noise_factor x its own largest fall over that scale (the history kept is twice the
    # longest scale), through all of its `parts` (each at least part_share of an even
    # share, none more than max_part_share of the rise), its second half at least
    # levelling_ratio of its first, at steady_ratio of the pace before it at least (up to
    # lookback_seconds back, not into loading).
    scales_seconds: list[PositiveFloat] = msgspec.field(default_factory=_default_scales)
    parts: Annotated[int, msgspec.Meta(ge=2)] = 4
    # Scales this long or longer are judged on halves instead (both halves rise: a
    # stepwise leak's steps come minutes apart, a lone step does not count).
    long_scale_seconds: PositiveFloat = 1200.0
    part_share: Ratio = 0.25
    max_part_share: Ratio = 0.5
    levelling_ratio: Ratio = 0.4
    steady_ratio: Ratio = 0.6
    lookback_seconds: NonNegFloat = 180.0
    min_rise_bytes: NonNegFloat = 96 * 2**20
    noise_factor: NonNegFloat = 2.0
    # Growth still in loading (no pause yet, past loading_max_seconds) is judged only on
    # scales this long or longer, once it rose by loading_min_rise_bytes over the scale,
    # its slowest part at least loading_part_ratio of its fastest, and its pace at least
    # loading_steady_ratio of the pace of all of its growth before it since its load (at
    # least half the scale, or loading_lookback_seconds when longer): a warm-up that levels
    # off slowly is slower than it was; a scale does not judge before that much history.
    loading_min_scale_seconds: PositiveFloat = 150.0
    loading_min_rise_bytes: NonNegFloat = 256 * 2**20
    loading_lookback_seconds: NonNegFloat = 0.0
    loading_part_ratio: Ratio = 0.5
    # ... and it fires once it held for as long as it takes to keep this much more.
    loading_confirm_bytes: NonNegFloat = 400 * 2**20
    loading_steady_ratio: Ratio = 0.7
    # A scale's leak shape must hold this share of the scale (at most confirm_seconds)
    # before it fires; half of it from long_confirm_from_seconds: rises that a window only
    # passes over (transients one after the other) hold less than half of it, a leak holds.
    confirm_share: Ratio = 0.25
    long_confirm_share: Ratio = 0.5
    long_confirm_from_seconds: PositiveFloat = 150.0
    confirm_seconds: NonNegFloat = 300.0
    # Exit level and minimum hold: a warning falls back once the retained memory rose less
    # than resolve_ratio x its slope over its exit window (the scale it fired on, at least
    # exit_window_seconds, plus the floor window) for resolve_seconds; a critical once the
    # raw lower envelope rose less than resolve_ratio x its slope on average over the last
    # critical_resolve_seconds.
    resolve_ratio: Ratio = 0.5
    exit_window_seconds: PositiveFloat = 120.0
    resolve_seconds: NonNegFloat = 120.0
    critical_resolve_seconds: NonNegFloat = 300.0
    # The GPU's series when the driver gives no per-process figures and it sums several
    # processes: its floor wanders with the beat of their sawtooths and their transients
    # chain, so its scales are this many times longer.
    sum_window_factor: Annotated[float, msgspec.Meta(ge=1)] = 2.0
    # Fast path for the critical slope in steady: the raw samples of this window, in quarters.
    critical_window_seconds: PositiveFloat = 40.0
    # In warm-up, growth is critical when the minima of each of early_parts parts of a full
    # early window climb at the critical slope, and the growth would spend the GPU's
    # budget within early_horizon_seconds.
    early_window_seconds: PositiveFloat = 50.0
    early_parts: Annotated[int, msgspec.Meta(ge=2)] = 5
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

    def __post_init__(self) -> None:
        if not self.scales_seconds:
            raise ValueError("scales_seconds: at least one scale")
        if min(self.scales_seconds) < self.parts * self.block_seconds:
            raise ValueError("scales_seconds: each scale must span at least parts x "
                             "block_seconds")


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
    # A projected time to OOM (the GPU's retained memory, or a leak judged on it) under
    # these horizons raises time_to_oom (and makes a leak critical under the critical one).
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
