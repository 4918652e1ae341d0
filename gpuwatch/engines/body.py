"""An engine's HTTP body -> the text gpuwatch records and what it reads from it.

Runs in a worker process of the engine source (never on the event loop): bounded
decompression, decoding, and read() with the endpoint's caps.
"""

from __future__ import annotations

import zlib

from gpuwatch.engines.config import DEFAULT_MAX_SERIES, DEFAULT_MAX_SERIES_GROUPS
from gpuwatch.exposition import Reading, compact, read

EXCERPT_CHARS = 80


def _decompress(body: bytes, encoding: str, cap: int) -> tuple[bytes | None, str]:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body, ""
    if encoding not in ("gzip", "x-gzip", "deflate"):
        return None, f"unsupported Content-Encoding {encoding[:40]!r}"
    # gzip, or deflate as zlib (RFC 9110) or, as some servers send it, raw
    tries = (16 + zlib.MAX_WBITS,) if "gzip" in encoding else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    for wbits in tries:
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, cap + 1)  # never more than the cap, whatever the ratio
        except zlib.error:
            continue
        if len(out) > cap or d.unconsumed_tail:
            return None, f"decompressed response is over the {cap}-byte limit"
        return out, ""
    return None, f"the {encoding} body could not be decompressed"


def prepare(
    body: bytes, encoding: str, kind: str, cap: int, max_series: int = DEFAULT_MAX_SERIES,
    max_groups: int = DEFAULT_MAX_SERIES_GROUPS,
) -> tuple[str | None, Reading | None, str]:
    """Body -> (text to record, its reading, '') or (None, None, why). Runs off the loop.

    The text is what read() uses of the body (compact), and the reading is read() of that
    very text, so the live analysis and a replay of the recording agree.
    """
    data, why = _decompress(body, encoding, cap)
    if data is None:
        return None, None, why
    text = data.decode("utf-8", errors="replace")
    kept = compact(text, kind, max_series)
    reading, why = read(kept, kind, max_series, max_groups)
    if reading is None:
        excerpt = text.lstrip()[:EXCERPT_CHARS]
        if not excerpt.isprintable():  # binary: the reason says so, bytes would not help
            return None, None, why[:200]
        return None, None, f"{why[:200]}; it starts with {excerpt!r}"
    return kept, reading, ""
