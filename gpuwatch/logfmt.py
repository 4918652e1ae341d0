"""Human text: one line per event or action (the daemon's log, replay's text output), URLs of
listen addresses, and the startup summary. JSON stays in the events log and replay --json."""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
from collections.abc import Iterable
from typing import Any

from gpuwatch.events import ActionEvent, Event
from gpuwatch.safetext import printable

MIB = 1 << 20

# (unit, divisor) of an event's value and threshold; a ratio or a count has no unit.
_UNITS: dict[str, tuple[str, float]] = {
    "memory_leak": ("MiB/s", MIB),
    "memory_zone": ("MiB", MIB),
    "time_to_oom": ("s", 1.0),
    "queue_latency": ("s", 1.0),
    "engine_down": ("failed scrapes", 1.0),
}


def iso(t: float) -> str:
    """UTC, second precision, 'Z': what a person pastes into a query."""
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LogFormatter(logging.Formatter):
    """The daemon's log lines: one ISO time (UTC, milliseconds), level, logger, message."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record, datefmt=None) -> str:
        t = dt.datetime.fromtimestamp(record.created, dt.UTC)
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def level(ev: Event | ActionEvent) -> int:
    """The log level of an event: its severity while firing, INFO once resolved; an action
    that failed or was refused is a warning."""
    if isinstance(ev, ActionEvent):
        return logging.WARNING if ev.result in ("failed", "refused") else logging.INFO
    if ev.state != "firing":
        return logging.INFO
    return logging.CRITICAL if ev.severity == "critical" else logging.WARNING


def number(x: float) -> str:
    """18611, 52.4, 0.35: whole numbers from 100 on, never an exponent."""
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}" if abs(x) >= 0.001 or x == 0 else f"{x:.6f}".rstrip("0")


def quantity(signal: str, value: float) -> str:
    unit, div = _UNITS.get(signal, ("", 1.0))
    text = number(value / div)
    return f"{text} {unit}" if unit else text


def _against(ev: Event) -> str:
    if ev.value is None:
        return ""
    if ev.threshold is None:
        return quantity(ev.signal, ev.value)
    op = ">" if ev.value > ev.threshold else "<" if ev.value < ev.threshold else "="
    return (f"{quantity(ev.signal, ev.value)} {op} threshold "
            f"{quantity(ev.signal, ev.threshold)}")


def target(ev: Event) -> str:
    pod = getattr(ev, "pod", None)
    owner = (("pod", pod and f"{getattr(ev, 'namespace', '') or ''}/{pod}"),
             ("slurm job", getattr(ev, "slurm_job_id", None)))
    parts = [f"{k} {v}" for k, v in (("gpu", ev.gpu_uuid), ("pid", ev.pid),
                                     ("engine", ev.engine), *owner) if v]
    return ", ".join(parts) or "host"


def human_line(ev: Event | ActionEvent, with_time: bool = True) -> str:
    """One line: time, severity, signal and state, target, value against threshold, message
    (without the time in the daemon's log, whose lines carry their own); control characters
    (of a process name, an engine's text) escaped."""
    ident = getattr(ev, "id", None)
    ref = getattr(ev, "ref", None)
    tag = "".join(f" [{k} {v}]" for k, v in (("id", ident), ("ref", ref)) if v)
    if isinstance(ev, ActionEvent):
        why = f": {ev.reason}" if ev.reason else ""
        via = f" (from {ev.trigger})" if ev.trigger else ""
        line = f"action {ev.action} {ev.target} -> {ev.result}{via}{why}{tag}"
        return printable(f"{iso(ev.t)} {line}" if with_time else line)
    head = f"{ev.severity.upper()} {ev.signal} {ev.state}"
    parts = [f"{iso(ev.t)} {head}" if with_time else head, target(ev)]
    against = _against(ev)
    if against:
        parts.append(against)
    if ev.message:
        parts.append(ev.message)
    return printable(" | ".join(parts) + tag)


def url_host(host: str) -> str:
    """A host as it goes into a URL: IPv6 literals in brackets."""
    try:
        if ipaddress.ip_address(host.split("%")[0]).version == 6:
            return f"[{host}]"
    except ValueError:
        pass
    return host


def listen_url(host: str, port: int, scheme: str = "http") -> str:
    """http://HOST:PORT/ for a parsed listen address; '' (all interfaces) shows as 0.0.0.0."""
    return f"{scheme}://{url_host(host or '0.0.0.0')}:{port}/"


def summary_lines(facts: dict[str, Any]) -> list[str]:
    """The startup summary, from plain facts the daemon gathers (kept pure for tests)."""
    lines = [f"gpuwatch {facts['version']}: configuration from {facts['config_source']}"]
    lines.append(f"state {facts['state_dir']}, audit log {facts['audit_path']}, "
                 f"events log {facts['events_log'] or 'off'}, "
                 f"recording {facts['record'] or 'off'}")
    rem = facts["remediation"]
    lines.append("remediation " + (
        f"on (hooks: {', '.join(rem['hooks']) or 'none'})" if rem["enabled"] else "off")
        + f", dry-run {'on' if rem['dry_run'] else 'off'}"
        + f", webhook {'on' if rem['webhook'] else 'off'}")
    gpus: Iterable[dict] = facts["gpus"]
    if not facts["gpus"]:
        lines.append(f"GPUs: none ({facts['gpu_reason'] or 'no GPU found'})")
    for g in gpus:
        row = (f"calibrated row {g['row']}" if g["calibrated"] else
               "derived row" + ("" if g["row"] == "derived" else f" {g['row']}"))
        lines.append(
            f"GPU {g['index']}: {g['name']}, {g['memory_total_bytes'] / MIB:.0f} MiB, {row}: "
            f"warning > {g['warning_bytes'] / MIB:.0f} MiB, "
            f"critical > {g['critical_bytes'] / MIB:.0f} MiB")
    configured = facts["engines_configured"]
    lines.append("engines configured: " + (", ".join(configured) or "none")
                 + "; discovery " + ("on" if facts["discovery"] else "off")
                 + (f", discovered: {', '.join(facts['engines_discovered'])}"
                    if facts["engines_discovered"] else ""))
    lines.append(f"serving on {facts['url']} (backend {facts['backend']}"
                 f"{', requires a GPU to be ready' if facts.get('require_gpu') else ''})")
    return lines
