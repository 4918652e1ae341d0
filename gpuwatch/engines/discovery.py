"""Find inference engines running on this host and where their metrics are served.

An engine's metrics URL follows from its command line (port flags and each engine's
defaults); its pid and every descendant's (vLLM's engine core and workers, TGI's shards)
are what NVML lists on the GPUs, which links the engine to its GPUs.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

import psutil

from gpuwatch.safetext import valid

WILDCARDS = {"0.0.0.0", "::", ""}


@dataclass
class Found:
    kind: str
    url: str
    pids: list[int] = field(default_factory=list)
    info_url: str = ""  # where it says its version, when not on the metrics port (Triton)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.url.rsplit(':', 1)[-1].split('/', 1)[0]}"


def _opt(argv: list[str], *names: str) -> str | None:
    """Value of --name VALUE or --name=VALUE (the last one given wins, as argparse does)."""
    value = None
    for i, arg in enumerate(argv):
        for n in names:
            if arg == n and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(n + "="):
                value = arg[len(n) + 1:]
    return value


def _flag(argv: list[str], name: str) -> bool:
    return any(
        a == name or (a.startswith(name + "=") and a[len(name) + 1:].lower() not in (
            "false", "0", "no"))
        for a in argv
    )


def _host(value: str | None) -> str:
    """Where to reach a server bound to value: wildcard or unset binds mean loopback."""
    if value is None or value in WILDCARDS:
        return "127.0.0.1"
    try:
        if ipaddress.ip_address(value).version == 6:
            return f"[{value}]"
    except ValueError:
        pass
    return value


def _port(value: str | None, default: int) -> int | None:
    if value is None:
        return default
    try:
        port = int(value)
    except ValueError:
        return None
    return port if 0 < port < 65536 else None


def _url(host: str, port: int | None, scheme: str = "http", path: str = "/metrics") -> str | None:
    return None if port is None else f"{scheme}://{host}:{port}{path}"


def _module(argv: list[str]) -> str:
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return argv[i + 1]
    return ""


def match_cmdline(argv: list[str]) -> tuple[str, str] | None:
    """(kind, metrics URL) when argv starts an engine server with metrics, else None."""
    if not argv:
        return None
    exe = os.path.basename(argv[0])
    base = [os.path.basename(a) for a in argv[:3]]
    module = _module(argv)

    if ("vllm" in base and "serve" in argv[1:4]) or module.startswith("vllm.entrypoints"):
        if _opt(argv, "--uds"):
            return None  # served on a unix socket: not reachable over TCP
        tls = _opt(argv, "--ssl-keyfile") and _opt(argv, "--ssl-certfile")
        url = _url(_host(_opt(argv, "--host")), _port(_opt(argv, "--port"), 8000),
                   "https" if tls else "http")
        return ("vllm", url) if url else None
    if module.startswith("sglang.launch_server") or ("sglang" in base and "serve" in argv[1:4]):
        if not _flag(argv, "--enable-metrics"):
            return None
        url = _url(_host(_opt(argv, "--host")), _port(_opt(argv, "--port"), 30000))
        return ("sglang", url) if url else None
    if exe == "text-generation-launcher":
        port = _opt(argv, "--prometheus-port") or _opt(argv, "--port", "-p")
        url = _url(_host(_opt(argv, "--hostname")), _port(port, 3000))
        return ("tgi", url) if url else None
    if exe == "llama-server":
        if not _flag(argv, "--metrics"):
            return None
        url = _url(_host(_opt(argv, "--host")), _port(_opt(argv, "--port"), 8080))
        return ("llamacpp", url) if url else None
    if exe == "tritonserver":
        allow = (_opt(argv, "--allow-metrics") or "true").lower()
        if allow in ("false", "0", "no"):
            return None
        host = _opt(argv, "--metrics-address") or _opt(argv, "--http-address")
        url = _url(_host(host), _port(_opt(argv, "--metrics-port"), 8002))
        return ("triton", url) if url else None
    return None


def info_url(kind: str, argv: list[str]) -> str:
    """Where an engine says its version when that is not its metrics port: Triton's HTTP
    endpoint (/v2), from --http-address and --http-port (default 8000)."""
    if kind != "triton":
        return ""
    allow = (_opt(argv, "--allow-http") or "true").lower()
    if allow in ("false", "0", "no"):
        return ""
    return _url(_host(_opt(argv, "--http-address")), _port(_opt(argv, "--http-port"), 8000),
                path="/v2") or ""


def _descendants(proc: psutil.Process) -> list[int]:
    try:
        return [p.pid for p in proc.children(recursive=True)]
    except (psutil.Error, OSError):
        return []


def family(pid: int) -> list[int]:
    """pid and all its descendants (an engine's GPU memory is held by its children)."""
    try:
        return sorted({pid, *_descendants(psutil.Process(pid))})
    except (psutil.Error, OSError):
        return [pid]


def listeners() -> dict[int, int]:
    """Local TCP ports in LISTEN state -> the pid listening (where the OS says)."""
    out: dict[int, int] = {}
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return out
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.pid and conn.laddr:
            out.setdefault(conn.laddr.port, conn.pid)
    return out


def scan(kinds: list[str] | tuple[str, ...] = ()) -> list[Found]:
    """Engines running now, one per metrics URL (forked workers share their parent's)."""
    by_url: dict[str, Found] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            argv = [valid(a) for a in proc.info.get("cmdline") or ()]  # a user's bytes
        except (psutil.Error, OSError):
            continue
        match = match_cmdline(argv)
        if match is None or (kinds and match[0] not in kinds):
            continue
        kind, url = match
        found = by_url.setdefault(url, Found(kind=kind, url=url, info_url=info_url(kind, argv)))
        found.pids.extend([proc.pid, *_descendants(proc)])
    for found in by_url.values():
        found.pids = sorted(set(found.pids))
    return sorted(by_url.values(), key=lambda f: f.url)
