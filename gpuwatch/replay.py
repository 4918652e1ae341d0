"""`gpuwatch replay`: the live daemon's analyzers and policy over a recording."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TextIO

from gpuwatch.config import Config
from gpuwatch.events import ActionEvent, Event, to_json
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import Tick
from gpuwatch.recording import read_recording
from gpuwatch.remediation.policy import Policy, planned_actions
from gpuwatch.signals.pipeline import Pipeline


def replay_steps(path: str, cfg: Config, actions: bool = True):
    """The recording's header, and an iterator of (tick, pipeline, events) per tick: the
    events the pipeline emitted, each followed by the actions the remediation policy would
    start for it (as dry-run action events: guardrails and identity checks depend on the
    live host). The pipeline is the live state after the tick, for views that plot it."""
    header, ticks = read_recording(path)
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


def iter_events(path: str, cfg: Config, actions: bool = True):
    """Every event the pipeline emits over the recording, in order (see replay_steps)."""
    for _, _, events in replay_steps(path, cfg, actions)[1]:
        yield from events


def _human(ev: Event | ActionEvent) -> str:
    if isinstance(ev, ActionEvent):
        return f"{ev.t:.3f} {'action':8} {ev.result:8} {ev.action:18} {ev.target}"
    where = " ".join(
        f"{k}={v}" for k, v in (("gpu", ev.gpu_uuid), ("pid", ev.pid), ("engine", ev.engine),
                                ("pod", ev.pod and f"{ev.namespace}/{ev.pod}"),
                                ("slurm_job", ev.slurm_job_id))
        if v is not None
    )
    value = "" if ev.value is None else f" value={ev.value:.6g}"
    limit = "" if ev.threshold is None else f" threshold={ev.threshold:.6g}"
    return f"{ev.t:.3f} {ev.state:8} {ev.severity:8} {ev.signal:18} {where}{value}{limit}"


def replay_events(path: str, cfg: Config, *, as_json: bool, out: TextIO,
                  actions: bool = True) -> int:
    n = 0
    for ev in iter_events(path, cfg, actions):
        out.write((to_json(ev) if as_json else _human(ev)) + "\n")
        n += 1
    return n
