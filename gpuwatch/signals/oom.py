"""Headroom and time to OOM (spec §6).

    budget      = (1 - alpha) x (V_total - V_system - V_reserve)     (the table row's)
    headroom    = budget - used                                       (NVML used: physical)
    time to OOM = max(headroom, 0) / leak rate                        (rate > 0 only)

Used memory here is everything on the GPU, planned pools included: a leak on top of a
pre-allocated pool runs out of the same physical memory. A GPU already past its budget
that still grows has a time to OOM of 0.
"""

from __future__ import annotations

from gpuwatch.signals.conditions import Hold


def headroom_bytes(budget_bytes: float, used_bytes: float) -> float:
    return budget_bytes - used_bytes


def time_to_oom(headroom: float, rate: float | None) -> float | None:
    """Seconds until the budget is spent at this rate; None when memory is not growing."""
    if rate is None or rate <= 0:
        return None
    return max(0.0, headroom) / rate


class HorizonState:
    """time_to_oom level (0 none, 1 warning, 2 critical): entered below a horizon, left
    only once the time to OOM is resolve_factor above it (or no leak is judged) and that
    has held for hold_seconds."""

    def __init__(self) -> None:
        self._hold = Hold()

    @property
    def level(self) -> int:
        return self._hold.level

    def update(self, t: float, ttoom: float | None, leaking: bool, cfg) -> int:
        level = self.level
        if not leaking or ttoom is None:
            raw = 0
        elif ttoom < cfg.critical_seconds or (
                level == 2 and ttoom < cfg.critical_seconds * cfg.resolve_factor):
            raw = 2
        elif ttoom < cfg.warning_seconds or (
                level >= 1 and ttoom < cfg.warning_seconds * cfg.resolve_factor):
            raw = 1
        else:
            raw = 0
        return self._hold.update(t, raw, cfg.hold_seconds)
