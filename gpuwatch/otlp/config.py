"""[otlp]: where and how the daemon pushes OTLP (off while endpoint is empty)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
QueueSize = Annotated[int, msgspec.Meta(ge=1, le=1000)]


class OtlpConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # OTLP/HTTP metrics URL, such as http://collector:4318/v1/metrics; empty: no push.
    endpoint: str = ""
    interval_seconds: PositiveFloat = 15.0
    # a push slower than this is abandoned (and retried at the next interval)
    timeout_seconds: PositiveFloat = 5.0
    # counters and histograms as totals since start, or as changes since the last push
    # (up-down counters and gauges stay as they are, as the SDKs' delta preference does)
    temporality: Literal["cumulative", "delta"] = "cumulative"
    # extra HTTP headers (an Authorization or a tenant header): secrets, masked on display
    headers: dict[str, str] = {}
    # pushes kept while the receiver is down or slow; the oldest is dropped beyond
    max_queued: QueueSize = 4
    # retries after a retryable failure wait one interval, then twice as long each time, to this
    max_backoff_seconds: PositiveFloat = 120.0
    compression: Literal["gzip", "none"] = "gzip"

    def __post_init__(self) -> None:
        if self.endpoint and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError("otlp.endpoint: must be an http:// or https:// URL")
        if self.timeout_seconds > self.interval_seconds:
            raise ValueError("otlp.timeout_seconds: must not exceed interval_seconds")
        for name, value in self.headers.items():
            # aiohttp would refuse these at the first push; say so at load time instead
            if not name or any(c in name for c in ":\r\n \t") or any(
                    c in value for c in "\r\n\0"):
                raise ValueError(f"otlp.headers: {name!r} is not a valid HTTP header")
