"""The simulated engine's workload, shared by its exposition (engine_text.py) and its serving
families (serving_text.py): request rate, queue-time distribution, and their integrals over
the time since the engine started.
"""

from __future__ import annotations

import math
from typing import NamedTuple

QUEUE_BUCKETS = (0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240,
                 480, 960, 1920, 7680)
REQUESTS_PER_SECOND = 4.0
PROMPT_TOKENS_PER_REQUEST = 500.0
PREEMPT_EVERY_SECONDS = 90.0
QUEUE_SIGMA = 0.9
SEGMENT_SECONDS = 60.0
QUEUE_MEDIAN = 0.25
QUEUE_MEDIANS = tuple(QUEUE_MEDIAN + 0.1 * math.sin(2 * math.pi * k / 6) for k in range(6))


def lognormal_cdf(x: float, median: float, sigma: float) -> float:
    return 0.5 * (1 + math.erf((math.log(x) - math.log(median)) / (sigma * math.sqrt(2))))


class Traffic(NamedTuple):
    """How busy a simulated engine is: its queue-time median, piecewise constant per
    SEGMENT_SECONDS through `medians` (a cycle), times `load`."""

    load: float = 1.0
    medians: tuple[float, ...] = QUEUE_MEDIANS


CYCLING = Traffic()


def segments_integral(e: float, f, traffic: Traffic = CYCLING) -> float:
    """Integral over [0, e] of f(median) with the median piecewise constant per segment."""
    medians = [m * traffic.load for m in traffic.medians]
    cycle = SEGMENT_SECONDS * len(medians)
    full, rest = divmod(e, cycle)
    total = full * SEGMENT_SECONDS * math.fsum(f(m) for m in medians)
    k = 0
    while rest > 0:
        span = min(rest, SEGMENT_SECONDS)
        total += span * f(medians[k % len(medians)])
        rest -= span
        k += 1
    return total


def finished_total(e: float) -> float:
    return float(math.floor(REQUESTS_PER_SECOND * max(e, 0.0)))


def queue_seconds_total(e: float, traffic: Traffic = CYCLING) -> float:
    mean = math.exp(QUEUE_SIGMA**2 / 2)
    return round(REQUESTS_PER_SECOND * segments_integral(max(e, 0.0), lambda m: m * mean,
                                                         traffic), 3)


def queries_total(e: float) -> float:
    return float(math.floor(REQUESTS_PER_SECOND * PROMPT_TOKENS_PER_REQUEST * max(e, 0.0)))
