"""`gpuwatch replay`: the live daemon's analyzers and policy over a recording."""

from __future__ import annotations

from typing import TextIO

from gpuwatch.config import Config
from gpuwatch.daemon import make_pipeline
from gpuwatch.events import Event, to_json
from gpuwatch.recording import read_recording


def iter_events(path: str, cfg: Config):
    """Every event the pipeline emits over the recording, in order."""
    _, ticks = read_recording(path)
    pipeline = make_pipeline(cfg)
    for tick in ticks:
        yield from pipeline.update(tick)


def _human(ev: Event) -> str:
    where = " ".join(
        f"{k}={v}" for k, v in (("gpu", ev.gpu_uuid), ("pid", ev.pid), ("engine", ev.engine))
        if v is not None
    )
    value = "" if ev.value is None else f" value={ev.value:.6g}"
    limit = "" if ev.threshold is None else f" threshold={ev.threshold:.6g}"
    return f"{ev.t:.3f} {ev.state:8} {ev.severity:8} {ev.signal:18} {where}{value}{limit}"


def replay_events(path: str, cfg: Config, *, as_json: bool, out: TextIO) -> int:
    n = 0
    for ev in iter_events(path, cfg):
        out.write((to_json(ev) if as_json else _human(ev)) + "\n")
        n += 1
    return n
