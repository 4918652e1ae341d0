"""Hugging Face Text Generation Inference (router/src/server.rs, metrics-exporter-prometheus).

Queue depth is tgi_queue_size, the running batch tgi_batch_current_size, and queue time the
tgi_request_queue_duration histogram (seconds; buckets from the router's `duration` matcher).
TGI labels no model and exposes no KV-cache or prefix-cache metric.
"""

from __future__ import annotations

from gpuwatch.exposition import common as c
from gpuwatch.exposition.parse import Exposition, wanted_names

PREFIXES = ("tgi_", "process_start_time_seconds")
WANTED = wanted_names((
    "tgi_queue_size",
    "tgi_batch_current_size",
    "tgi_request_queue_duration",
    "process_start_time_seconds",
))
GROUP: tuple[str, ...] = ()


def normalize(expo: Exposition, text: str) -> c.Reading:
    r = c.Reading(kind="tgi", generation="tgi", ranks=1)
    r.start_time = c.start_time(expo)
    c.set_gauge(r, "requests_running", c.REQUESTS_RUNNING, expo, "tgi_batch_current_size")
    c.set_gauge(r, "requests_waiting", c.REQUESTS_WAITING, expo, "tgi_queue_size")
    r.missing[c.KV_USAGE] = "TGI exposes no KV-cache usage metric"
    r.missing[c.PREFIX_CACHE] = "TGI exposes no prefix-cache counters"
    r.missing[c.KV_HIT_RATIO] = "TGI exposes no prefix-cache counters"
    r.missing[c.PREEMPTION] = "TGI exposes no preemption counter"

    why = c.add_histogram(r, expo, "tgi_request_queue_duration", GROUP)
    if r.has_counter(c.QUEUE_COUNT):
        r.sli_source["queue"] = "tgi_request_queue_duration"
    if why:
        # Without configured buckets the exporter writes a summary: its quantiles cover the
        # exporter's own window, so only _sum/_count (the mean) are used.
        have_mean = c.add_counter(r, expo, "tgi_request_queue_duration_sum", c.QUEUE_SUM, GROUP)
        have_mean &= c.add_counter(
            r, expo, "tgi_request_queue_duration_count", c.QUEUE_COUNT, GROUP
        )
        r.missing[c.QUEUE_LATENCY] = (
            "tgi_request_queue_duration has no buckets (summary): only the mean is available"
            if have_mean else "tgi_request_queue_duration " + (
                c.NOT_EXPOSED if why == c.NOT_EXPOSED else why)
        )
    return r
