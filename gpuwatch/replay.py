"""`gpuwatch replay`: the live daemon's analyzers and policy over a recording."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TextIO

from gpuwatch.config import Config
from gpuwatch.events import ActionEvent, Event, to_json
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.logfmt import human_line, iso
from gpuwatch.model import Tick
from gpuwatch.recording import ReadReport, read_recording
from gpuwatch.remediation.policy import Policy, planned_actions
from gpuwatch.signals.pipeline import Pipeline


def replay_steps(path: str, cfg: Config, actions: bool = True,
                 report: ReadReport | None = None):
    """The recording's header, and an iterator of (tick, pipeline, events) per tick: the
    events the pipeline emitted, each followed by the actions the remediation policy would
    start for it (as dry-run action events: guardrails and identity checks depend on the
    live host). The pipeline is the live state after the tick, for views that plot it."""
    header, ticks = read_recording(path, report)
    pipeline = Pipeline.from_config(cfg)
    policy = Policy(cfg.remediation, pipeline.table) if actions else None

    def steps() -> Iterator[tuple[Tick, Pipeline, list[Event | ActionEvent]]]:
        for tick in ticks:
            signals = pipeline.update(tick)
            events: list[Event | ActionEvent] = list(signals)
            if policy is not None and signals:
                snap = Snapshot(tick=tick, derived=pipeline.derived)
                events += planned_actions(policy, signals, snap)
            yield tick, pipeline, events

    return header, steps()


def iter_events(path: str, cfg: Config, actions: bool = True,
                report: ReadReport | None = None):
    """Every event the pipeline emits over the recording, in order (see replay_steps)."""
    for _, _, events in replay_steps(path, cfg, actions, report)[1]:
        yield from events


def truncation_warning(path: str, report: ReadReport) -> str | None:
    """Where a recording cut short by a crash stops, or None when it is whole."""
    if report.cut is None:
        return None
    upto = f", the last at {iso(report.last_t)}" if report.last_t is not None else ""
    return (f"{path} is truncated: {report.cut}; replayed the {report.ticks} ticks "
            f"before the cut{upto}")


def replay_events(path: str, cfg: Config, *, as_json: bool, out: TextIO,
                  actions: bool = True, report: ReadReport | None = None) -> int:
    n = 0
    for ev in iter_events(path, cfg, actions, report):
        out.write((to_json(ev) if as_json else human_line(ev)) + "\n")
        n += 1
    return n
