"""Configuration of engine endpoints and discovery (the engine signals' own settings, kv_cache
and queue, live with the other signals in gpuwatch.signals.config)."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit

import msgspec

from gpuwatch.redact import mask_url
from gpuwatch.signals.config import (
    DEFAULT_DOWN_AFTER_FAILURES,
    DEFAULT_FORGET_ENGINE_AFTER_SECONDS,
    DEFAULT_FORGET_GROUP_AFTER_SCRAPES,
    DEFAULT_MAX_SERIES,
    DEFAULT_MAX_SERIES_GROUPS,
)

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]

# Engine kinds gpuwatch normalizes; "auto" recognizes one of them from the exposition.
KINDS = ("vllm", "sglang", "tgi", "llamacpp", "triton")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024

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
    down_after_failures: PositiveInt = DEFAULT_DOWN_AFTER_FAILURES
    # Where the engine says its version (and model): "" derives it from url for the kinds
    # that serve it on the metrics port; Triton serves it on its HTTP port (/v2).
    info_url: str = ""

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
        if self.info_url:
            try:
                check_url(self.info_url)
            except ValueError as exc:
                raise ValueError("info_url: " + str(exc).removeprefix("url: ")) from None
        for key in self.headers:
            if not key or any(c in key for c in ":\r\n "):
                raise ValueError(f"headers: {key!r} is not a valid header name")
        for key, value in self.headers.items():
            if "\r" in value or "\n" in value:
                raise ValueError(f"headers: value of {key!r} contains a line break")
        self._one_authorization()

    def _one_authorization(self) -> None:
        """URL credentials, bearer_token and an Authorization header all become the one
        Authorization header: with two of them the HTTP client refuses every request, so
        the engine would pass validation and then be down at runtime."""
        parts = urlsplit(self.url)
        given = [what for what, present in (
            ("credentials in the url", parts.username is not None or parts.password is not None),
            ("bearer_token", bool(self.bearer_token)),
            ("an Authorization header", any(k.lower() == "authorization" for k in self.headers)),
        ) if present]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} would both be sent as the Authorization "
                             "header: give only one")


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
    down_after_failures: PositiveInt = DEFAULT_DOWN_AFTER_FAILURES
    # Only these kinds (empty: all).
    kinds: list[str] = []
    # An engine that sends no sample (not even a failed scrape) for this long is forgotten:
    # its series disappear and its events resolve. Configured engines are scraped for as
    # long as the daemon runs, so in practice this only retires discovered engines.
    forget_after_seconds: PositiveFloat = DEFAULT_FORGET_ENGINE_AFTER_SECONDS
    # A discovered engine whose process has left the process table is still scraped (and
    # so reported down, engine_down firing) for this long: it was expected to serve, and
    # its absence must page. Then it is forgotten.
    expect_gone_seconds: PositiveFloat = 3600.0

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise ValueError(
                f"kinds: unknown kind(s) {', '.join(map(repr, bad))}; "
                f"expected {', '.join(KINDS)}"
            )
