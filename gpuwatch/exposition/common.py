"""The normalized reading every engine module produces, and helpers to build it."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuwatch.exposition import layout as layout_mod
from gpuwatch.exposition.parse import Exposition, LabelKey

# Counter names inside Reading.counters (per series group).
PREFIX_HITS = "prefix_hits"
PREFIX_QUERIES = "prefix_queries"
PREEMPTIONS = "preemptions"
QUEUE_COUNT = "queue_count"
QUEUE_SUM = "queue_sum"  # seconds
QUEUE_LE = "queue_le:"  # + repr(upper bound): cumulative bucket counts
# + repr(a gpuwatch bound, layout.BOUNDS): the engine's buckets mapped onto gpuwatch's layout
GW_LE = "gw_le:"

# Keys of Reading.missing / EngineState.missing.
REQUESTS_RUNNING = "requests_running"
REQUESTS_WAITING = "requests_waiting"
KV_USAGE = "kv_cache_usage_ratio"
PREFIX_CACHE = "prefix_cache"
KV_HIT_RATIO = "kv_cache_hit_ratio"
QUEUE_LATENCY = "queue_latency"
QUEUE_MEAN = "queue_latency_mean"
PREEMPTION = "preemptions"

NOT_EXPOSED = "not in this scrape"

# The largest count or sum gpuwatch accepts from an engine: 2**53, above which a float can
# no longer count by one, so every later increase would be lost. A larger value is an
# invalid sample: it is left out of that scrape (and of the counters' state), and the engine
# recovers as soon as sane values come back.
COUNTER_MAX = float(2**53)
INVALID = "invalid value (NaN, negative or above 2^53)"
MAX_NOTE_CHARS = 200
MAX_MODEL_CHARS = 256
MAX_QUANTILE_GROUPS = 64


@dataclass
class Reading:
    """One scrape of one engine, in gpuwatch's terms. None / absent means unknown."""

    kind: str
    generation: str = ""
    model: str = ""
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage_ratio: float | None = None
    # Raw counter values per series group (a data-parallel rank, a Triton model): counters
    # of one group reset together when that process restarts.
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    prefix_unit: str = ""  # tokens | blocks
    # An engine-computed hit ratio, used only where the engine exposes no counters.
    hit_ratio_gauge: float | None = None
    hit_ratio_gauge_note: str = ""
    # Upper bounds of the queue-time buckets, counters named bucket_name(bound); last +Inf.
    queue_bounds: tuple[float, ...] = ()
    cache_config: dict[str, str] = field(default_factory=dict)
    # Memory facts: 0 awake, 1 weights offloaded, 2 weights and KV discarded (vLLM sleep
    # mode); the KV pool the engine planned, in tokens and, where it says, in bytes.
    sleep_level: int | None = None
    kv_pool_tokens: float | None = None
    kv_pool_bytes: float | None = None
    # process_start_time_seconds where exposed: a change means the engine restarted.
    start_time: float | None = None
    ranks: int = 0
    groups_left_out: int = 0  # series groups beyond the endpoint's cap, not read
    missing: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # Serving SLIs (normalize/slis.py): bucket bounds and source family per latency SLI.
    sli_bounds: dict[str, tuple[float, ...]] = field(default_factory=dict)
    sli_source: dict[str, str] = field(default_factory=dict)
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    counts_errors: bool = False
    sli_missing: dict[str, str] = field(default_factory=dict)  # merged into missing
    # The engine's own families that gpuwatch does not read, and those the alias table
    # calls removed (aliases.py).
    unread_families: list[str] = field(default_factory=list)
    # Engines that serve several models in one process (Triton) label each series with its
    # model: model_label names that label, and group_models gives each series group's model.
    # Elsewhere the engine's one model is `model`, and groups map to nothing.
    model_label: str = ""
    group_models: dict[str, str] = field(default_factory=dict)
    # Whether the exposition was one gpuwatch reads with nothing being served (a Triton
    # with no model loaded): up, and said apart from an engine that is down.
    models_loaded: int | None = None
    served_models: list[str] | None = None  # the models it serves now, where it says
    # An engine's own windowed quantiles where it has no histogram (Triton's summaries):
    # group -> sli -> quantile label -> seconds.
    engine_quantiles: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def has_counter(self, name: str) -> bool:
        return any(name in c for c in self.counters.values())


def bucket_name(bound: float) -> str:
    return f"{QUEUE_LE}{bound!r}"


def gw_name(bound: float) -> str:
    return f"{GW_LE}{bound!r}"


def remember_model(reading: Reading, group: str, key: LabelKey) -> None:
    if reading.model_label and group not in reading.group_models:
        reading.group_models[group] = label(key, reading.model_label)[:MAX_MODEL_CHARS]


def counter_value(v: float) -> float | None:
    return v if 0 <= v <= COUNTER_MAX else None  # NaN compares false


def note(r: Reading, text: str) -> None:
    """A note for /api/state; bounded, as label values in it come from the engine."""
    if len(r.notes) < 20:
        r.notes.append(text if len(text) <= MAX_NOTE_CHARS else text[:MAX_NOTE_CHARS] + "...")


count_value = counter_value


def ratio_value(v: float) -> float | None:
    """A 0..1 ratio; tiny float overshoot is clamped, anything else is invalid."""
    if not math.isfinite(v) or v < -1e-9 or v > 1 + 1e-6:
        return None
    return min(max(v, 0.0), 1.0)


def label(key: LabelKey, name: str, default: str = "") -> str:
    for k, v in key:
        if k == name:
            return v
    return default


def group_of(key: LabelKey, group_labels: tuple[str, ...]) -> str:
    """The series group a label set belongs to, e.g. 'engine=0' or 'model=x,version=1'."""
    return ",".join(f"{g}={label(key, g)}" for g in group_labels if label(key, g))


def first_rank(
    series: dict[LabelKey, float], rank_labels: tuple[str, ...]
) -> dict[LabelKey, float]:
    """Keep one series per label set ignoring rank_labels: the lowest-ranked one.

    Tensor-parallel workers of one engine report the same scheduler numbers; summing
    them would count every request once per GPU.
    """
    if not rank_labels:
        return series
    best: dict[LabelKey, tuple[tuple, LabelKey]] = {}
    for key in series:
        rest = tuple(kv for kv in key if kv[0] not in rank_labels)
        order = tuple(_rank_order(label(key, r)) for r in rank_labels)
        if rest not in best or order < best[rest][0]:
            best[rest] = (order, key)
    return {key: series[key] for _, key in best.values()}


def _rank_order(v: str) -> tuple[int, str]:
    try:
        return (int(v), "")
    except ValueError:
        return (1 << 30, v)


def set_gauge(r: Reading, attr: str, signal: str, expo: Exposition, name: str,
              **kw) -> None:
    """r.<attr> from the gauge `name`, or why it is absent in r.missing[signal]."""
    value, why = gauge(expo, [name], **kw)
    setattr(r, attr, value)
    if value is None:
        r.missing[signal] = why or f"{name} {NOT_EXPOSED}"


def gauge(
    expo: Exposition,
    names: Iterable[str],
    *,
    check=count_value,
    how: str = "sum",
    rank_labels: tuple[str, ...] = (),
    where: dict[str, str] | None = None,
) -> tuple[float | None, str]:
    """Aggregate a gauge over its series (sum across ranks/models, or mean).

    Returns (value, why-absent). The first name present wins (current names before
    deprecated ones).
    """
    for name in names:
        if name not in expo:
            continue
        series = first_rank(expo.get(name), rank_labels)
        if where:
            series = {
                k: v for k, v in series.items()
                if all(label(k, lk) == lv for lk, lv in where.items())
            }
            if not series:
                continue
        good = [check(v) for v in series.values()]
        if not good or any(v is None for v in good):
            # one invalid series makes the total unknown, not smaller
            return None, f"{name} has an {INVALID}"
        total = math.fsum(good)
        value = total / len(good) if how == "mean" else total
        return (value, "") if math.isfinite(value) else (None, f"{name} overflows")
    return None, ""


def add_counter(
    reading: Reading,
    expo: Exposition,
    source: str,
    target: str,
    group_labels: tuple[str, ...],
    *,
    rank_labels: tuple[str, ...] = (),
    scale: float = 1.0,
    keep=None,
) -> bool:
    """Copy a counter's series into reading.counters[group][target]; False if absent.

    keep(label_key) -> bool selects series (default: all).
    """
    series = expo.get(source)
    if not series:
        return False
    found = False
    invalid = 0
    for key, raw in first_rank(series, rank_labels).items():
        if keep is not None and not keep(key):
            continue
        v = counter_value(raw)
        if v is None:
            invalid += 1
            continue
        name = group_of(key, group_labels)
        remember_model(reading, name, key)
        group = reading.counters.setdefault(name, {})
        group[target] = group.get(target, 0.0) + v * scale
        found = True
    if invalid:
        note(reading, f"{source}: {invalid} series with an {INVALID} left out of this scrape")
    return found


def add_histogram(
    reading: Reading,
    expo: Exposition,
    base: str,
    group_labels: tuple[str, ...],
    *,
    rank_labels: tuple[str, ...] = (),
) -> str:
    """Copy a histogram's buckets, _count and _sum into reading.counters.

    Returns '' on success, else why the histogram is unusable. Series whose bucket
    layout differs from the first one are left out (noted): their buckets cannot be added.
    """
    buckets = first_rank(expo.get(base + "_bucket"), rank_labels)
    if not buckets:
        return NOT_EXPOSED
    per_group: dict[str, dict[float, float]] = {}
    for key, raw in buckets.items():
        le_text = label(key, "le")
        try:
            le = float(le_text)
        except ValueError:
            return f"{base}_bucket has a non-numeric le={le_text[:40]!r}"
        if math.isnan(le):
            return f"{base}_bucket has le=NaN"
        v = counter_value(raw)
        if v is None:
            return f"{base}_bucket has an {INVALID}"
        rest = tuple(kv for kv in key if kv[0] != "le")
        name = group_of(rest, group_labels)
        remember_model(reading, name, rest)
        group = per_group.setdefault(name, {})
        group[le] = group.get(le, 0.0) + v
    layout: tuple[float, ...] | None = None
    usable: dict[str, list[float]] = {}
    for group, by_le in per_group.items():
        bounds = tuple(sorted(by_le))
        if not bounds or not math.isinf(bounds[-1]):
            note(reading, f"{base} ({group or 'all'}) has no +Inf bucket: left out")
            continue
        if layout is None:
            layout = bounds
        elif bounds != layout:
            note(reading, f"{base} ({group or 'all'}) has other buckets: left out")
            continue
        usable[group] = [by_le[b] for b in bounds]
    if layout is None:
        return f"{base} has no usable buckets"
    reading.queue_bounds = layout
    sums: dict[str, float] = {}
    for key, v in first_rank(expo.get(base + "_sum"), rank_labels).items():
        g = group_of(key, group_labels)
        sums[g] = sums.get(g, 0.0) + v
    for group, counts in usable.items():
        c = reading.counters.setdefault(group, {})
        for b, v in zip(layout, counts, strict=True):
            c[bucket_name(b)] = v
        for b, v in zip(layout_mod.BOUNDS, layout_mod.remap(layout, counts), strict=False):
            c[gw_name(b)] = v
        c[QUEUE_COUNT] = counts[-1]
        s = sums.get(group)
        if s is not None and counter_value(s) is not None:
            c[QUEUE_SUM] = s
    return ""


def model_name(expo: Exposition, names: Iterable[str], label_name: str) -> str:
    """The distinct values of a model label, sorted and joined (usually just one)."""
    models: set[str] = set()
    for name in names:
        for key in expo.get(name):
            v = label(key, label_name)
            if v:
                models.add(v)
        if models:
            break
    joined = ",".join(sorted(models))
    return joined if len(joined) <= 256 else joined[:253] + "..."


def start_time(expo: Exposition) -> float | None:
    for v in expo.get("process_start_time_seconds").values():
        if math.isfinite(v) and v > 0:
            return v
    return None


def count_groups(expo: Exposition, name: str, group_labels: tuple[str, ...]) -> int:
    return len({group_of(k, group_labels) for k in expo.get(name)})
