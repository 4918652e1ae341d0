"""Human-readable figures, the same in the report and the terminal status (the page's script
formats alike). MiB and GiB are 2^20 and 2^30 bytes, as in the threshold table. Absent
values are shown as a dash, never as zero."""

from __future__ import annotations

import math
import time

DASH = "\u2014"
MIB = 1 << 20
GIB = 1 << 30


def _ok(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def size(v) -> str:
    if not _ok(v):
        return DASH
    return f"{v / GIB:.1f} GiB" if abs(v) >= 10 * GIB else f"{v / MIB:.0f} MiB"


def rate(v) -> str:
    if not _ok(v):
        return DASH
    return f"{v / MIB:.1f} MiB/s" if abs(v) >= MIB else f"{v * 60 / MIB:.1f} MiB/min"


def duration(s) -> str:
    if not _ok(s):
        return DASH
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def time_to_oom(s, headroom=None) -> str:
    """A time to OOM, or that the budget is spent already (0: past it and still growing)."""
    if _ok(headroom) and headroom < 0:
        return f"over budget by {size(-headroom)}"
    if _ok(s) and s == 0:
        return "over budget"
    return duration(s)


def percent(v) -> str:
    if not _ok(v):
        return DASH
    return f"{100 * v:.1f} %" if v < 0.1 else f"{100 * v:.0f} %"


def clock(t, with_date: bool = False) -> str:
    if not _ok(t):
        return DASH
    return time.strftime("%Y-%m-%d %H:%M:%SZ" if with_date else "%H:%M:%SZ", time.gmtime(t))


# How each signal's value and threshold read (events carry them in base units).
_SIGNAL_UNIT = {
    "memory_leak": rate,
    "memory_zone": lambda v: f"{v / MIB:.0f} MiB" if _ok(v) else DASH,  # as in the table
    "time_to_oom": duration,
    "fragmentation": percent,
    "kv_cache_hit_ratio": percent,
    "queue_latency": lambda v: f"{v * 1000:.0f} ms" if _ok(v) else DASH,
}


def signal_value(signal: str, v) -> str:
    fmt = _SIGNAL_UNIT.get(signal)
    if fmt is not None:
        return fmt(v)
    return f"{v:.6g}" if _ok(v) else DASH


def place(uuid, pid, engine, gpu_labels: dict, names: dict) -> str:
    """'GPU 0 · pid 4242 (python3) · engine vllm-0' for an event or an action's subject."""
    parts = []
    if uuid:
        parts.append(str(gpu_labels.get(uuid, uuid)))
    if pid is not None:
        parts.append(f"pid {pid}" + (f" ({names[pid]})" if names.get(pid) else ""))
    if engine:
        parts.append(f"engine {engine}")
    return " · ".join(parts) or DASH
