"""gpuwatch's one bucket layout for every latency histogram, and how an engine's own buckets
map onto it.

Engines bucket their latencies differently (vLLM's TTFT, ITL and E2E histograms have three
layouts, SGLang and TGI others), and buckets of different layouts cannot be added: a fleet-wide
`histogram_quantile` over `sum by (le)` needs one layout. gpuwatch re-buckets each engine
histogram onto BOUNDS.

The cumulative count at a gpuwatch bound g is read off the engine's cumulative distribution,
interpolated linearly between the engine's own bounds (what `histogram_quantile` assumes
inside a bucket); below the engine's first bound it rises linearly from 0 at 0, above its last
finite bound it stays at that bound's count (those requests are known only to be slower).
Each mapped count is a non-negative combination of two engine counts, so it only grows when
they do: mapped buckets are counters like the engine's.

Error bound: the piecewise-linear distribution that `histogram_quantile` reads from the
mapped buckets agrees with the engine's at every gpuwatch bound, so a quantile taken from the
mapped buckets lies in the same gpuwatch bucket (g_lo, g_hi] as the engine's own
`histogram_quantile`: they differ by at most g_hi - g_lo, and not at all where no engine
bound falls strictly inside that gpuwatch bucket (the distribution is linear across it). The
measured errors on real captures are in benchmarks/histogram_mapping.py.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

# Seconds: the union of the layouts engines share, so that theirs map exactly: time to first
# token as vLLM, SGLang and OpenTelemetry's gen_ai.server.time_to_first_token bucket it
# (0.001 ... 10), time per output token likewise (0.01 ... 2.5), and vLLM's request latency
# (end to end, queue, prefill, decode: 0.3 ... 7680), with 0.5 ms and 2.5 ms for fast decoders.
BOUNDS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.025, 0.04, 0.05, 0.06, 0.075, 0.08, 0.1,
    0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 15.0,
    20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
# as client libraries write them (le="1.0"), which rules select by
LE_LABELS: tuple[str, ...] = (*(repr(float(b)) for b in BOUNDS), "+Inf")


def remap(bounds: Sequence[float], cumulative: Sequence[float],
          to: Sequence[float] = BOUNDS) -> list[float]:
    """Cumulative counts at each bound of `to`, then +Inf, from an engine histogram.

    bounds: the engine's sorted upper bounds ending in +Inf; cumulative: its counts, same
    length. Counts forced monotonic first, as Prometheus does.
    """
    if len(bounds) != len(cumulative) or not bounds or not math.isinf(bounds[-1]):
        raise ValueError("an engine histogram needs matching bounds and counts ending in +Inf")
    mono: list[float] = []
    top = 0.0
    for c in cumulative:
        top = max(top, c)
        mono.append(top)
    finite = list(bounds[:-1])
    out: list[float] = []
    for g in to:
        out.append(_at(g, finite, mono))
    out.append(mono[-1])
    return out


def _at(g: float, finite: list[float], mono: list[float]) -> float:
    """The engine's interpolated cumulative count at g."""
    if not finite:
        return 0.0
    i = bisect.bisect_left(finite, g)
    if i < len(finite) and finite[i] == g:
        return mono[i]
    if i == len(finite):
        return mono[len(finite) - 1]  # beyond its last finite bound: known only to be slower
    lo, c_lo = (finite[i - 1], mono[i - 1]) if i > 0 else (0.0, 0.0)
    hi, c_hi = finite[i], mono[i]
    if g <= lo or hi <= lo:  # a negative or zero first bound: nothing is known below it
        return c_lo
    return c_lo + (c_hi - c_lo) * (g - lo) / (hi - lo)


def resolution(bounds: Sequence[float]) -> float | None:
    """The smallest latency an engine histogram can tell apart from 0: its first positive
    bound. A quantile in the bucket below it is only known to be at most that much."""
    return next((b for b in bounds if b > 0 and math.isfinite(b)), None)
