"""Reading TOML files into msgspec structs with errors that name the key and the reason.

Shared by the configuration and the threshold table, whose authors see the same messages.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec


def read_toml(path: str | Path, error: type[Exception]) -> dict[str, Any]:
    """The file's data; `error` with the path and the reason when it cannot be read."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text: {exc}") from None
    except OSError as exc:
        raise error(f"{path}: {exc.strerror or exc}") from None


def explain(exc: msgspec.ValidationError) -> tuple[str, str]:
    """(key, reason) of a validation error: 'nvml.fast' and 'unknown key', or
    'engines[0].url' and msgspec's own reason."""
    msg = str(exc)
    m = re.match(r"(?s)(.*) - at `\$(.*)`$", msg)
    reason, loc = (m.group(1), m.group(2).lstrip(".")) if m else (msg, "")
    for pattern, what in ((r"Object contains unknown field `(.+)`", "unknown key"),
                          (r"Object missing required field `(.+)`", "required key missing")):
        field = re.match(pattern, reason)
        if field:
            return (f"{loc}.{field.group(1)}" if loc else field.group(1)), what
    return loc, reason
