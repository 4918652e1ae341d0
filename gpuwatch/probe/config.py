"""Where in-process probes publish their stats."""

from __future__ import annotations

import msgspec


class ProbeConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = True
    dir: str = ""
