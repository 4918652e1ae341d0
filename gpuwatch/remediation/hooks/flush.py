"""Flush: the caching allocator inside a process (torch.cuda.empty_cache() through the
probe, which reports what it released), or an engine's cache endpoint (vLLM
`POST /reset_prefix_cache`, dev mode only; SGLang `/flush_cache`, 400 while requests run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from gpuwatch.remediation.hooks import HookFailed, probe_channel

if TYPE_CHECKING:
    import aiohttp

# Engine kind -> the path of its cache flush, relative to the server root.
ENGINE_FLUSH_PATHS = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}
_HINTS = {
    ("vllm", 404): "vLLM serves /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1",
    ("sglang", 400): "SGLang refuses to flush while requests are running",
}


@dataclass(frozen=True)
class Endpoint:
    engine: str
    url: str
    method: str = "POST"
    kind: str = ""
    headers: dict[str, str] = field(default_factory=dict)


def derive_endpoint(engine: str, kind: str, metrics_url: str,
                    headers: dict[str, str] | None = None) -> Endpoint | None:
    """The flush endpoint of a vLLM / SGLang server, from the URL its metrics come from."""
    path = ENGINE_FLUSH_PATHS.get(kind)
    if path is None or not metrics_url:
        return None
    parts = urlsplit(metrics_url)
    if parts.scheme not in ("http", "https"):
        return None
    return Endpoint(engine=engine, url=urlunsplit((parts.scheme, parts.netloc, path, "", "")),
                    kind=kind, headers=dict(headers or {}))


async def via_probe(probe_dir: str, pid: int, timeout: float) -> dict:
    res = await probe_channel.request(probe_dir, pid, "flush", None, timeout)
    # The answer is the process's user's text: only typed, short facts of it are kept.
    if not res.get("ok"):
        why = str(res.get("error") or "no reason")[:300]
        raise HookFailed(f"probe flush in pid {pid} failed: {why}")
    detail = {"via": "probe"}
    for key in ("released_bytes", "reserved_before", "reserved_after"):
        if type(res.get(key)) is int:
            detail[key] = res[key]
    return detail


async def via_engine(session: aiohttp.ClientSession, ep: Endpoint, timeout: float) -> dict:
    import aiohttp

    detail = {"via": "engine", "engine": ep.engine, "url": ep.url}
    try:
        async with session.request(ep.method, ep.url, headers=ep.headers,
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            body = (await resp.content.read(512)).decode(errors="replace").strip()
            detail["status"] = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise HookFailed(f"{ep.engine}: {ep.method} {ep.url} failed: "
                         f"{exc.__class__.__name__} {exc}".strip(), detail) from None
    if not 200 <= resp.status < 300:
        hint = _HINTS.get((ep.kind, resp.status))
        reason = f"{ep.engine}: {ep.method} {ep.url} answered {resp.status}"
        reason += f" ({hint})" if hint else (f": {body[:200]}" if body else "")
        raise HookFailed(reason, detail)
    # A prefix-cache reset frees blocks inside the engine's pre-allocated pool: the GPU
    # memory it holds does not change, so there are no released bytes to report.
    return detail
