"""The OTLP pusher's own health, where an endpoint is configured (otlp/push.py)."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch.exporter.metric import CounterMetricFamily, GaugeMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot


def collect(snap: Snapshot) -> Iterator[Metric]:
    c = snap.extras.get("otlp")
    if not c:
        return
    for key, text in (("pushed", "OTLP requests the receiver accepted."),
                      ("failed", "OTLP pushes that failed (down, slow, refused)."),
                      ("dropped", "Encoded OTLP requests dropped from a full queue."),
                      ("rejected", "OTLP requests the receiver refused for good (an "
                                   "answer OTLP does not retry).")):
        yield CounterMetricFamily(f"gpuwatch_otlp_{key}_requests", text, value=c[key])
    yield GaugeMetricFamily("gpuwatch_otlp_queued_requests",
                            "Encoded OTLP requests waiting for the receiver.", value=c["queued"])
