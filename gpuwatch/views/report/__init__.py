"""`gpuwatch report RECORDING -o FILE.html`: a self-contained HTML report of a recording.

It runs the replay pipeline (`replay_steps`: the same analyzers and policy as the live daemon
and `gpuwatch replay`) and, tick by tick, keeps what a person needs to see: memory per GPU
and per judged process against the threshold zones, the leak detector's retained floor and
fitted trend, events and planned actions, and the engines' KV cache and queue. Series are
decimated into bounded min/max envelopes, so any recording length renders in bounded memory.

The package has one module per section of the page (findings, ooms, actions, gpus,
engines, events), `collect` for what is kept of the replay, `page` for the whole.
"""

from __future__ import annotations

import os

from gpuwatch.replay import replay_steps
from gpuwatch.views.report.actions import add_audit
from gpuwatch.views.report.collect import Collector
from gpuwatch.views.report.findings import Finding, findings
from gpuwatch.views.report.page import render

__all__ = ["Collector", "Finding", "add_audit", "build", "findings", "render"]


def build(recording: str, cfg, *, actions: bool = True, max_points: int = 500,
          audit: str | None = None) -> str:
    """The report's HTML for a recording (raises ValueError for a bad recording)."""
    from gpuwatch.recording import ReadReport
    from gpuwatch.replay import truncation_warning

    read = ReadReport()
    header, steps = replay_steps(recording, cfg, actions, read)
    collector: Collector | None = None
    for tick, pipeline, events in steps:
        if collector is None:
            collector = Collector(tick.t, max_points, header.interval_s)
        collector.step(tick, pipeline, events)
    if collector is None:
        raise ValueError(f"{recording}: the recording has no samples")
    if audit:
        add_audit(collector, audit, header.interval_s)
    warning = truncation_warning(os.path.basename(recording), read)
    return render(collector, header, os.path.basename(recording), warning)
