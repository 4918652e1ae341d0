"""Metrics URLs: from a `--engine URL` flag, and for comparing endpoints."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit, urlunsplit

from gpuwatch.engines.config import EngineConfig, check_url
from gpuwatch.redact import mask_url

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", ""}


def normalize_url(url: str) -> str:
    """'host:8000' -> 'http://host:8000/metrics'; a bare host or '/' path gets /metrics."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return (parts.hostname or ""), port


def endpoint_name(url: str) -> str:
    """host:port, the name an engine given by URL alone is known by."""
    host, port = host_port(url)
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def is_local(url: str) -> bool:
    return host_port(url)[0] in LOCAL_HOSTS


def same_local_endpoint(a: str, b: str) -> bool:
    """Both URLs point at this host on the same port (however the host is spelled)."""
    (ha, pa), (hb, pb) = host_port(a), host_port(b)
    return pa == pb and ha in LOCAL_HOSTS and hb in LOCAL_HOSTS


def engine_from_url(url: str, name: str | None = None) -> EngineConfig:
    """An EngineConfig for a `--engine URL` flag: kind auto, named host:port.

    Raises ValueError with a message naming the flag when the URL is unusable.
    """
    full = normalize_url(url)
    try:
        check_url(full)
    except ValueError as exc:
        raise ValueError(f"--engine {mask_url(url)!r}: {str(exc).removeprefix('url: ')}") from None
    return EngineConfig(name=name or endpoint_name(full), url=full)


def engines_from_urls(urls, taken=()) -> list[EngineConfig]:
    """EngineConfigs for repeated --engine flags; a repeated host:port gets a -2, -3 suffix."""
    names = set(taken)
    out: list[EngineConfig] = []
    for url in urls:
        cfg = engine_from_url(url)
        name, n = cfg.name, 1
        while name in names:
            n += 1
            name = f"{cfg.name}-{n}"
        names.add(name)
        out.append(engine_from_url(url, name=name))
    return out
