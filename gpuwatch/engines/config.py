"""Configuration of engine endpoints, discovery and the engine signals."""

from __future__ import annotations

from typing import Annotated

import msgspec

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]


class EngineConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    url: str
    kind: str = "auto"
    interval_seconds: PositiveFloat = 5.0
    timeout_seconds: PositiveFloat = 2.0
    headers: dict[str, str] = {}
    bearer_token: str = ""


class DiscoveryConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = False
