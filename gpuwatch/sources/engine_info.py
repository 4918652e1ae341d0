"""An engine's version and served model, from its own info endpoint.

/metrics says neither for most engines (vLLM's version, llama.cpp's model). Each kind has an
endpoint that does, on the same server:

| kind | endpoint | version | model |
|---|---|---|---|
| vllm | `GET /version` | `version` | (its metrics label) |
| llamacpp | `GET /props` | `build_info` | the file name of `model_alias` (default: its path) |
| sglang | `GET /get_server_info` | `version` | `served_model_name`, else `model_path` |
| tgi | `GET /info` | `version` | `model_id` |
| triton | `GET /v2` (its HTTP port, not the metrics port) | `version` | (per model, in metrics) |

Fetched after a successful scrape when none is known yet, after the engine was down (it may
have been upgraded), and every REFRESH_SECONDS; with the endpoint's own session (its headers),
only on the scrape URL's origin unless an info_url is configured, bounded in bytes and time.
An answer that is not the JSON expected is simply no info.
"""

from __future__ import annotations

import asyncio
import json
import os
from urllib.parse import urlsplit, urlunsplit

import aiohttp

PATHS = {"vllm": "/version", "llamacpp": "/props", "sglang": "/get_server_info",
         "tgi": "/info"}
MAX_BYTES = 256 * 1024  # llama.cpp's /props carries the chat template
REFRESH_SECONDS = 600.0
MAX_VERSION = 64
MAX_MODEL = 256


def url_for(kind: str, metrics_url: str, info_url: str = "") -> str | None:
    """Where the engine says what it is; Triton only where configured (or discovered)."""
    if info_url:
        return info_url
    path = PATHS.get(kind)
    if path is None:
        return None
    p = urlsplit(metrics_url)
    return urlunsplit((p.scheme, p.netloc, path, "", ""))


def _text(v, limit: int) -> str:
    if not isinstance(v, str | int | float) or isinstance(v, bool):
        return ""
    s = "".join(ch for ch in str(v) if ch.isprintable())
    return s[:limit]


def parse(kind: str, body: bytes) -> dict[str, str]:
    """{"version": ..., "model": ...} from an info answer; {} when it is not one."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(doc, dict):
        return {}
    out = {"version": _text(doc.get("build_info" if kind == "llamacpp" else "version"),
                            MAX_VERSION)}
    if kind == "llamacpp":
        # its alias defaults to the model's path: the file name is what names the model
        name = _text(doc.get("model_alias"), 4096) or _text(doc.get("model_path"), 4096)
        out["model"] = _text(os.path.basename(name.rstrip("/")) or name, MAX_MODEL)
    elif kind == "sglang":
        out["model"] = _text(doc.get("served_model_name") or doc.get("model_path"), MAX_MODEL)
    elif kind == "tgi":
        out["model"] = _text(doc.get("model_id"), MAX_MODEL)
    return {k: v for k, v in out.items() if v}


async def fetch(session: aiohttp.ClientSession, url: str, kind: str,
                timeout: float) -> dict[str, str]:
    """One bounded GET of the info endpoint; {} on any failure (never raises but cancel)."""
    try:
        async with asyncio.timeout(timeout):
            async with session.get(url, allow_redirects=False,
                                   headers={"Accept-Encoding": "identity"}) as resp:
                if resp.status != 200:
                    return {}
                if resp.content_length is not None and resp.content_length > MAX_BYTES:
                    return {}
                body = await resp.content.read(MAX_BYTES + 1)
                if len(body) > MAX_BYTES:
                    return {}
                if resp.headers.get("Content-Encoding", "") not in ("", "identity"):
                    return {}  # the session leaves bodies compressed; info is small
    except asyncio.CancelledError:
        raise
    except Exception:
        return {}
    return parse(kind, body)
