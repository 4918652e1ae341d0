"""`gpuwatch check`: a setup doctor. One line per check, ok / warn / fail with the fix; a
failure makes the exit status non-zero, so a service manager can run it before the daemon."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.config import Config, parse_listen
from gpuwatch.logfmt import listen_url
from gpuwatch.paths import (
    creatable_file_problem,
    writable_dir_problem,
    writable_file_problem,
)
from gpuwatch.startup import probe_dir_verdict

MAX_ENGINE_BODY = 8 << 20  # enough for any engine's /metrics; never read more


@dataclass(frozen=True)
class Finding:
    status: str  # ok | warn | fail
    name: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f" -> fix: {self.fix}" if self.fix and self.status != "ok" else ""
        return f"{self.status:<4} {self.name}: {self.detail}{fix}"


def _gpu_host() -> bool:
    """The NVIDIA kernel driver is loaded here, so a failing NVML is a real problem."""
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0")


def check_gpus(cfg: Config) -> Finding:
    from gpuwatch.sources.base import BackendUnavailable
    from gpuwatch.sources.sampler import make_backend

    backend = make_backend(cfg)
    try:
        backend.open()
        gpus = backend.sample(time.time())
    except BackendUnavailable as exc:
        if _gpu_host():
            return Finding("fail", "nvml", str(exc), "install the NVIDIA driver's NVML library "
                           "(libnvidia-ml.so.1) matching the kernel module; run nvidia-smi")
        return Finding("warn", "nvml", f"{exc}; no NVIDIA driver on this machine, the daemon "
                       "serves without GPU data", "on a GPU host install the driver; to try "
                       "gpuwatch here, run it with --simulate mixed")
    finally:
        with contextlib.suppress(Exception):  # closing a backend that never opened
            backend.close()
    if not gpus:
        return Finding("warn", "nvml", f"driver {backend.driver_version}, but no GPU visible",
                       "check NVIDIA_VISIBLE_DEVICES / the nvml.gpus setting")
    names = ", ".join(f"{g.index} {g.name} ({g.memory_total_bytes >> 20} MiB)" for g in gpus)
    return Finding("ok", backend.name, f"driver {backend.driver_version}, {len(gpus)} GPU(s): "
                   f"{names}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # credentials stay on the configured host
        return None


def _fetch(url: str, headers: dict[str, str], timeout: float) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
    req = urllib.request.Request(url, headers=headers)
    with opener.open(req, timeout=timeout) as r:
        body = r.read(MAX_ENGINE_BODY + 1)
    if len(body) > MAX_ENGINE_BODY:
        raise ValueError(f"response larger than {MAX_ENGINE_BODY >> 20} MiB")
    return body.decode("utf-8", "replace")


def check_engines(cfg: Config) -> Iterator[Finding]:
    from gpuwatch.exposition.detect import describe_unrecognized, detect_kind

    if not cfg.engines:
        yield Finding("ok" if cfg.discovery.enabled else "warn", "engines",
                      "none configured; discovery " + ("on" if cfg.discovery.enabled else "off"),
                      "add [[engines]] with the engine's metrics URL, or [discovery] enabled")
    for eng in cfg.engines:
        name = f"engine {eng.name}"
        headers = dict(eng.headers)
        if eng.bearer_token:
            headers["Authorization"] = f"Bearer {eng.bearer_token}"
        try:
            text = _fetch(eng.url, headers, eng.timeout_seconds)
        except urllib.error.HTTPError as exc:
            yield Finding("fail", name, f"{eng.url} answered HTTP {exc.code}",
                          "check the URL's path (/metrics) and the engine's metrics flag")
            continue
        except (OSError, ValueError) as exc:
            # Down is a state the daemon watches (engine_down), not a setup error: engines may
            # start after gpuwatch.
            reason = getattr(exc, "reason", None) or exc
            yield Finding("warn", name, f"{eng.url} unreachable now: {reason}",
                          "start the engine, or fix url (and its metrics flag: SGLang "
                          "--enable-metrics, llama.cpp --metrics)")
            continue
        kind = detect_kind(text)
        if kind is None:
            yield Finding("fail", name, f"{eng.url}: {describe_unrecognized(text)}",
                          "point url at the engine's Prometheus /metrics")
            continue
        if eng.kind not in ("auto", kind):
            yield Finding("warn", name, f"configured kind {eng.kind}, but it looks like {kind}",
                          f"set kind = \"{kind}\" or \"auto\"")
            continue
        # An engine's own *_info series (python_info's version is the interpreter's).
        m = re.search(r'^(?!python_)[A-Za-z_:][\w:]*_info\{[^}\n]*\bversion="([^"]{1,40})"',
                      text, re.M)
        version = f", version {m[1]}" if m else ", version not exposed"
        yield Finding("ok", name, f"{eng.url} reachable, {kind}{version}")


def _dir_finding(name: str, path: str, private: bool) -> Finding:
    """A directory gpuwatch writes in: it, or the parent it will be created in, is usable."""
    try:
        return _dir_finding_of(name, path, private)
    except OSError as exc:  # a parent this user cannot enter
        return Finding("fail", name, f"{path}: {exc.strerror}",
                       f"give this user access to {path}, or run gpuwatch as root")


def _dir_finding_of(name: str, path: str, private: bool) -> Finding:
    p = Path(path)
    if p.is_symlink():
        return Finding("fail", name, f"{path} is a symbolic link", f"make {path} a directory")
    if not p.exists():
        parent = next((a for a in p.parents if a.exists()), Path("/"))
        problem = writable_dir_problem(str(parent))
        if problem:
            return Finding("fail", name, f"{path} does not exist and {problem}",
                           f"mkdir -p {path}")
        return Finding("ok", name, f"{path} (created at start)")
    problem = writable_dir_problem(path)
    if problem:
        return Finding("fail", name, problem, f"chown the directory to this user or fix {path}")
    mode = stat.S_IMODE(p.stat().st_mode)
    if private and mode & 0o022:
        return Finding("warn", name, f"{path} is writable by others (mode {mode:o})",
                       f"chmod 0700 {path}")
    return Finding("ok", name, f"{path} (mode {mode:o})")


def check_paths(cfg: Config) -> Iterator[Finding]:
    from gpuwatch.probe_channel.config import resolve_dir
    from gpuwatch.remediation.remediator import state_dir

    state = str(state_dir())
    yield _dir_finding("state directory", state, private=True)
    audit = cfg.remediation.audit.path or os.path.join(state, "audit.jsonl")
    snaps = cfg.remediation.snapshot.dir or os.path.join(state, "snapshots")
    if cfg.remediation.snapshot.dir:
        yield _dir_finding("snapshot directory", snaps, private=True)
    for name, path in (("audit log", audit), ("events log", cfg.events_log),
                       ("recording", cfg.record)):
        if not path:
            continue
        missing = not os.path.exists(os.path.dirname(os.path.abspath(path)))
        problem = (creatable_file_problem if name != "recording" else writable_file_problem)(
            path)
        if missing and not problem:
            yield Finding("ok", name, f"{path} (its directory is created at start)")
            continue
        yield (Finding("fail", name, problem, f"fix {name.replace(' ', '_')} or create its "
                       "directory") if problem else Finding("ok", name, path))
    if cfg.probe.enabled:
        v = probe_dir_verdict(resolve_dir(cfg.probe.dir))
        yield Finding(v.status, "probe directory", v.detail, v.fix)


def check_listen(cfg: Config) -> Finding:
    host, port = parse_listen(cfg.listen)
    url = listen_url(host, port)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host or None, port, family if host else socket.AF_UNSPEC,
                                   socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
        fam, _, _, _, addr = infos[0]
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
    except OSError as exc:
        return Finding("fail", "listen", f"cannot bind {url}: {exc.strerror or exc}",
                       "stop what uses the port (another gpuwatch?) or choose listen = "
                       "\"HOST:PORT\"")
    return Finding("ok", "listen", f"{url} is free")


def _shipped(name: str, flag: str, directory: str | None, render,
             suffixes: tuple[str, ...]) -> Finding:
    if not directory:
        return Finding("warn", name, "not checked", f"pass {flag} DIR where they are installed")
    expected = render()
    stale = []
    for fname, text in expected.items():
        path = Path(directory) / fname
        if not fname.endswith(suffixes):
            continue
        try:
            if path.read_text() != text:
                stale.append(fname)
        except OSError:
            stale.append(f"{fname} (missing)")
    if stale:
        return Finding("fail", name, f"{directory}: {', '.join(stale)} differ from this version",
                       f"regenerate them: gpuwatch {name} -o {directory}")
    return Finding("ok", name, f"{directory} matches this version")


def check_artefacts(rules_dir: str | None, dashboards_dir: str | None) -> Iterator[Finding]:
    from gpuwatch.monitoring import dashboards, rules

    yield _shipped("alerts", "--rules-dir", rules_dir,
                   lambda: rules.render(rules.RuleParams(), "rules"), (".yml",))
    yield _shipped("dashboards", "--dashboards-dir", dashboards_dir, dashboards.render,
                   (".json",))


def run_checks(cfg: Config, source: str, rules_dir: str | None = None,
               dashboards_dir: str | None = None) -> Iterator[Finding]:
    yield Finding("ok", "config", source)
    yield check_gpus(cfg)
    yield from check_engines(cfg)
    yield from check_paths(cfg)
    yield from check_artefacts(rules_dir, dashboards_dir)
    yield check_listen(cfg)
