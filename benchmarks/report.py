"""How every benchmark reports: JSON on stdout, and to a file when one is named."""

from __future__ import annotations

import json
from pathlib import Path


def emit(result: dict, path: str | None = None) -> None:
    text = json.dumps(result, indent=2)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
