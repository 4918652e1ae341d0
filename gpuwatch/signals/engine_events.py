"""The engine signals' events: the KV-cache hit ratio under its floor, the queue time over its
objective. Pure: they read the EngineState the analyzer derived and the configuration."""

from __future__ import annotations

from gpuwatch.events import Event
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.config import KvCacheSignalConfig, QueueSignalConfig
from gpuwatch.signals.derived import EngineState


def qlabel(q: float) -> str:
    return format(q, "g")


def judge_kv(cfg: KvCacheSignalConfig, t: float, st: EngineState,
             conditions: Conditions) -> list[Event]:
    key = ("kv_cache_hit_ratio", None, None, st.name)
    ratio = st.kv_cache_hit_ratio
    if not cfg.floor or ratio is None:
        return conditions.set(t, None, key)
    windowed = st.kv_cache_hit_ratio_source == "window"
    if windowed and (st.kv_cache_queries_in_window or 0.0) < cfg.min_queries:
        return []  # too little traffic to judge: keep the current state
    severity, threshold = None, cfg.floor
    if cfg.critical_floor and ratio < cfg.critical_floor:
        severity, threshold = "critical", cfg.critical_floor
    elif ratio < cfg.floor:
        severity = "warning"
    if severity is None:
        return conditions.set(t, None, key)
    what = (f"over the last {cfg.window_seconds:g}s" if windowed
            else "as computed by the engine since it started")
    ev = Event(
        t=t, signal="kv_cache_hit_ratio", state="firing", severity=severity,
        engine=st.name, value=ratio, threshold=threshold,
        message=f"engine {st.name}: KV-cache hit ratio {ratio:.3f} {what} is below "
                f"{threshold:g}",
    )
    return conditions.set(t, ev, key)


def judge_queue(cfg: QueueSignalConfig, t: float, st: EngineState, conditions: Conditions,
                has_histogram: bool) -> list[Event]:
    key = ("queue_latency", None, None, st.name)
    if not cfg.slo_seconds:
        return conditions.set(t, None, key)
    q = qlabel(cfg.slo_quantile)
    value = st.queue_latency_seconds.get(q)
    what = f"p{float(q) * 100:g} queue time"
    if value is None and cfg.judge_mean_without_histogram and not has_histogram:
        value = st.queue_latency_mean_seconds
        what = "mean queue time (the engine has no queue-time histogram)"
    if value is None or q in st.sli_below_resolution.get("queue", ()):
        # below the engine's first bucket the histogram says only "at most its bound": an
        # objective under that bound cannot be judged, and one above it is met (an empty
        # queue read from buckets that start at 0.3 s)
        return conditions.set(t, None, key)
    if (st.queue_requests_in_window or 0.0) < cfg.min_requests:
        return []
    severity, threshold = None, cfg.slo_seconds
    if cfg.critical_seconds and value > cfg.critical_seconds:
        severity, threshold = "critical", cfg.critical_seconds
    elif value > cfg.slo_seconds:
        severity = "warning"
    if severity is None:
        return conditions.set(t, None, key)
    ev = Event(
        t=t, signal="queue_latency", state="firing", severity=severity, engine=st.name,
        value=value, threshold=threshold,
        message=f"engine {st.name}: {what} {value:.3g}s over the last "
                f"{cfg.window_seconds:g}s exceeds {threshold:g}s",
    )
    return conditions.set(t, ev, key)
