"""The memory analyzer's event texts: what a leak or a time to OOM was judged on."""

from __future__ import annotations

from gpuwatch.events import Event
from gpuwatch.signals.leak import STEADY, LeakSeries
from gpuwatch.signals.projection import UNATTRIBUTED, Projection

MIB = 1 << 20
SEVERITY = {1: "warning", 2: "critical"}


def rate_text(bps: float) -> str:
    if abs(bps) >= MIB:
        return f"{bps / MIB:.1f} MiB/s"
    return f"{bps * 60 / MIB:.1f} MiB/min"


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def leak_message(who: str, source: str, series: LeakSeries, level: int, slope: float,
                 tolerance: float) -> str:
    rate, limit = series.value or 0.0, series.threshold or 0.0
    what = {"probe": "allocator reserved memory",
            "unattributed": "memory no process accounts for"}.get(source, "memory")
    when = "" if series.judged_phase == STEADY else f" during {series.judged_phase}"
    scale = series.verdict.scale
    over = f" over {duration(scale)}" if scale else ""
    return (f"{who}: retained {what} grows {rate_text(rate)}{over}{when}, at or above "
            f"{rate_text(limit)} ({SEVERITY[level]} slope {rate_text(slope)} less "
            f"{tolerance:.0%} tolerance)")


def time_to_oom_event(t: float, uuid: str, index: int, level: int, ttoom: float,
                      headroom: float, rate: float, limit: float,
                      projection: Projection | None, names: dict[int, str]) -> Event:
    """The time_to_oom firing event. Its figures are those at firing (events are
    immutable): the message says so; the current ones are in the metrics and /api/state."""
    if headroom <= 0:
        head = (f"GPU {index} is over its memory budget by {-headroom / MIB:.0f} MiB and its "
                f"retained memory still grows {rate_text(rate)}")
    else:
        head = (f"GPU {index} runs out of its memory budget in {duration(ttoom)} at "
                f"{rate_text(rate)}")
    basis = "the leaks judged on it"
    if projection is not None:
        basis = f"its retained memory over the last {duration(projection.scale)}"
        if projection.risers:
            basis += "; rising most: " + ", ".join(
                _member(m, names) + f" +{rise / MIB:.0f} MiB" for m, rise in projection.risers)
    return Event(
        t=t, signal="time_to_oom", state="firing", severity=SEVERITY[level], gpu_uuid=uuid,
        value=ttoom, threshold=limit,
        message=(f"{head} (under the {SEVERITY[level]} horizon of {duration(limit)}), "
                 f"projected from {basis}; as measured when this event fired (the current "
                 f"figure is in /api/state)"))


def _member(m: int, names: dict[int, str]) -> str:
    if m == UNATTRIBUTED:
        return "memory no process accounts for"
    return f"pid {m} ({names.get(m) or '?'})"
