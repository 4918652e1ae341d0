"""Headroom and time to OOM (spec §6).

    budget      = (1 - alpha) x (V_total - V_system - V_reserve)     (the table row's)
    headroom    = budget - used                                       (NVML used: physical)
    time to OOM = max(headroom, 0) / leak rate                        (rate > 0 only)

Used memory here is everything on the GPU, planned pools included: a leak on top of a
pre-allocated pool runs out of the same physical memory. A GPU already past its budget
that still grows has a time to OOM of 0.
"""

from __future__ import annotations


def headroom_bytes(budget_bytes: float, used_bytes: float) -> float:
    return budget_bytes - used_bytes


def time_to_oom(headroom: float, rate: float | None) -> float | None:
    """Seconds until the budget is spent at this rate; None when memory is not growing."""
    if rate is None or rate <= 0:
        return None
    return max(0.0, headroom) / rate


class HorizonState:
    """time_to_oom level (0 none, 1 warning, 2 critical) with a resolve margin."""

    def __init__(self) -> None:
        self.level = 0

    def update(self, ttoom: float | None, leaking: bool, warning_s: float, critical_s: float,
               resolve_factor: float) -> int:
        if not leaking or ttoom is None:
            self.level = 0
        elif ttoom < critical_s or (self.level == 2 and ttoom < critical_s * resolve_factor):
            self.level = 2
        elif ttoom < warning_s or (self.level >= 1 and ttoom < warning_s * resolve_factor):
            self.level = 1
        else:
            self.level = 0
        return self.level
