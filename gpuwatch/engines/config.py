"""Configuration of engine endpoints, discovery and the engine signals."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

import msgspec

from gpuwatch.redact import mask_url

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]

# Engine kinds gpuwatch normalizes; "auto" recognizes one of them from the exposition.
KINDS = ("vllm", "sglang", "tgi", "llamacpp", "triton")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# Per endpoint: sample lines of the metrics gpuwatch reads kept from one scrape (a real
# engine has a few hundred), series groups (data-parallel ranks, Triton models) tracked,
# and how many scrapes a group may be absent before it is forgotten.
DEFAULT_MAX_SERIES = 20_000
DEFAULT_MAX_SERIES_GROUPS = 512
DEFAULT_FORGET_GROUP_AFTER_SCRAPES = 60

_NAME_RE = re.compile(r"[A-Za-z0-9\[][A-Za-z0-9_.:\[\]\-]{0,127}")


def check_url(url: str) -> None:
    """Raise ValueError unless url is an absolute http(s) URL with a host."""
    shown = mask_url(url)  # the message may be logged: never with its credentials
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a malformed port
    except ValueError as exc:
        raise ValueError(f"url: {shown!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"url: {shown!r} must start with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"url: {shown!r} has no host")
    if port == 0:
        raise ValueError(f"url: {shown!r} has port 0")


class EngineConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    url: str
    kind: str = "auto"
    interval_seconds: PositiveFloat = 5.0
    timeout_seconds: PositiveFloat = 2.0
    # A response larger than this (after decompression) marks the endpoint down instead of
    # being parsed.
    max_body_bytes: PositiveInt = DEFAULT_MAX_BODY_BYTES
    max_series: PositiveInt = DEFAULT_MAX_SERIES
    max_series_groups: PositiveInt = DEFAULT_MAX_SERIES_GROUPS
    forget_group_after_scrapes: PositiveInt = DEFAULT_FORGET_GROUP_AFTER_SCRAPES
    headers: dict[str, str] = {}
    bearer_token: str = ""
    # engine_down fires after this many consecutive failed scrapes (engine_up drops at once).
    down_after_failures: PositiveInt = 2

    def __post_init__(self) -> None:
        if not _NAME_RE.fullmatch(self.name):
            raise ValueError(
                f"name: {self.name!r} must be 1-128 characters of letters, digits, "
                "'_', '.', ':', '-' or brackets, starting with a letter, digit or '['"
            )
        if self.kind not in ("auto", *KINDS):
            raise ValueError(
                f"kind: must be one of auto, {', '.join(KINDS)} (got {self.kind!r})"
            )
        check_url(self.url)
        for key in self.headers:
            if not key or any(c in key for c in ":\r\n "):
                raise ValueError(f"headers: {key!r} is not a valid header name")
        for key, value in self.headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"headers: value of {key!r} contains a line break")


class DiscoveryConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Find engine processes on this host (psutil) and scrape them without configuration.
    enabled: bool = False
    # How often the process table is scanned.
    interval_seconds: PositiveFloat = 30.0
    # Scrape settings for discovered engines.
    scrape_interval_seconds: PositiveFloat = 5.0
    timeout_seconds: PositiveFloat = 2.0
    max_body_bytes: PositiveInt = DEFAULT_MAX_BODY_BYTES
    max_series: PositiveInt = DEFAULT_MAX_SERIES
    max_series_groups: PositiveInt = DEFAULT_MAX_SERIES_GROUPS
    forget_group_after_scrapes: PositiveInt = DEFAULT_FORGET_GROUP_AFTER_SCRAPES
    down_after_failures: PositiveInt = 2
    # Only these kinds (empty: all).
    kinds: list[str] = []
    # An engine that sends no sample (not even a failed scrape) for this long is forgotten:
    # its series disappear and its events resolve. Configured engines are scraped for as
    # long as the daemon runs, so in practice this only retires discovered engines.
    forget_after_seconds: PositiveFloat = 120.0

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise ValueError(
                f"kinds: unknown kind(s) {', '.join(map(repr, bad))}; "
                f"expected {', '.join(KINDS)}"
            )


class KvCacheSignalConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """KV-cache (prefix-cache) hit ratio = increase(hits) / increase(queries) over a window."""

    window_seconds: PositiveFloat = 300.0
    # A warning fires when the windowed hit ratio falls below this floor. Off (0) by
    # default: what a good ratio is depends entirely on the workload's shared prefixes.
    floor: Ratio = 0.0
    # Critical below this (0: no critical level).
    critical_floor: Ratio = 0.0
    # Judge only windows with at least this many queries (tokens, or blocks for engines
    # that count blocks), so a handful of requests cannot fire the event.
    min_queries: NonNegFloat = 1000.0

    def __post_init__(self) -> None:
        if self.critical_floor and self.floor and self.critical_floor > self.floor:
            raise ValueError("critical_floor: must not be above floor")


class QueueSignalConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Queue latency quantiles over a window, from the engine's queue-time histogram."""

    window_seconds: PositiveFloat = 300.0
    quantiles: list[float] = msgspec.field(default_factory=lambda: [0.5, 0.95, 0.99])
    # The quantile judged against the SLO.
    slo_quantile: float = 0.95
    # A warning fires when that quantile exceeds this many seconds (0: off).
    slo_seconds: NonNegFloat = 5.0
    # Critical above this (0: no critical level).
    critical_seconds: NonNegFloat = 0.0
    # Judge only windows in which at least this many requests left the queue.
    min_requests: NonNegFloat = 10.0
    # Engines without a queue-time histogram (Triton) expose only total queue time and a
    # request count; judge their windowed mean against the SLO instead (said in the event).
    judge_mean_without_histogram: bool = True

    def __post_init__(self) -> None:
        for q in (*self.quantiles, self.slo_quantile):
            if not 0 < q < 1:
                raise ValueError(f"quantiles: {q} is not strictly between 0 and 1")
        if self.critical_seconds and self.slo_seconds and self.critical_seconds < self.slo_seconds:
            raise ValueError("critical_seconds: must not be below slo_seconds")
