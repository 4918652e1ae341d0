"""An immutable view of the daemon's latest state: everything an output renders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuwatch.events import Event
from gpuwatch.model import Tick
from gpuwatch.signals.derived import Derived


@dataclass
class SourceStatus:
    """Health of one source (nvml, an engine, probes): it fails alone."""

    up: bool = False
    reason: str = ""
    last_success: float | None = None
    last_duration_seconds: float | None = None
    errors_total: int = 0


@dataclass(frozen=True)
class Snapshot:
    version: int = 0
    # engine ticks published so far: pre-rendered bytes never hide a newer engine scrape
    engine_version: int = 0
    tick: Tick | None = None
    derived: Derived = field(default_factory=Derived)
    sources: dict[str, SourceStatus] = field(default_factory=dict)
    active_events: tuple[Event, ...] = ()
    recent_events: tuple[Event, ...] = ()
    ready: bool = False
    started: float = 0.0
    # per-subsystem extras (e.g. "remediation": counters), rendered by their own families
    extras: dict[str, Any] = field(default_factory=dict)
    config: Any = None
