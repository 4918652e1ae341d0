"""Signal parameters (leak, zone, fragmentation, engine signals)."""

from __future__ import annotations

import msgspec


class SignalsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass
