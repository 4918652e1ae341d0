"""How to flush a target: through the probe in its process, else through its engine's cache
endpoint (configured, or derived from the URL its metrics come from)."""

from __future__ import annotations

from typing import Any

from gpuwatch.remediation import identity
from gpuwatch.remediation.config import RemediationConfig
from gpuwatch.remediation.hooks import Target
from gpuwatch.remediation.hooks import flush as flush_hook


def has_probe(target: Target, probes: dict[int, float | None]) -> bool:
    """Does a probe publish for the target's process (not for an earlier one with its pid)?"""
    if target.pid is None or target.pid not in probes:
        return False
    probe_ct = probes[target.pid]
    return probe_ct is None or target.create_time is None or (
        identity.ticks_of(probe_ct) == identity.ticks_of(target.create_time))


def plan(target: Target, arg: str, probes: dict[int, float | None],
         endpoint: flush_hook.Endpoint | None) -> list[tuple[str, Any]]:
    """[(kind, what)]: ("probe", pid) or ("engine", Endpoint); empty when nothing can flush."""
    if arg in ("", "probe") and has_probe(target, probes):
        return [("probe", target.pid)]
    if arg in ("", "engine") and endpoint is not None:
        return [("engine", endpoint)]
    return []


def endpoint_for(target: Target, config: RemediationConfig, engines: dict[str, dict[str, Any]],
                 snap: Any) -> flush_hook.Endpoint | None:
    """The cache endpoint of the target's engine: configured, else derived."""
    engine = target.engine
    if engine is None and target.pid is not None:
        engine = next((n for n, i in engines.items() if target.pid in i.get("pids", ())), None)
    if engine is None:
        return None
    for ep in config.flush.endpoints:
        if ep.engine == engine:
            return flush_hook.Endpoint(engine, ep.url, ep.method.upper(), "", ep.headers)
    info = dict(engines.get(engine, {}))
    headers: dict[str, str] = {}
    for eng_cfg in getattr(getattr(snap, "config", None), "engines", None) or ():
        if getattr(eng_cfg, "name", None) == engine:
            if getattr(eng_cfg, "kind", "auto") != "auto":
                info["kind"] = eng_cfg.kind
            info.setdefault("url", eng_cfg.url)
            headers.update(getattr(eng_cfg, "headers", {}) or {})
            if getattr(eng_cfg, "bearer_token", ""):
                headers["Authorization"] = f"Bearer {eng_cfg.bearer_token}"
    kind = info.get("kind")
    if kind in (None, "", "auto"):  # what the engines analyzer recognised
        derived = getattr(getattr(snap, "derived", None), "engines", {}).get(engine)
        kind = getattr(derived, "kind", "") or ""
    return flush_hook.derive_endpoint(engine, kind, info.get("url", ""), headers)
