"""Leak detection on recorded traces: real torch processes on an H200 (real NVML, 1 s ticks)
and the second, independently written family of synthetic traces (benchmarks/leak_traces2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import leak_traces2
from gpuwatch.config import Config
from gpuwatch.recording import read_recording
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.thresholds import load_table

H200 = Path(__file__).parent / "fixtures" / "traces" / "h200"


def _replay(path: Path):
    _, ticks = read_recording(str(path))
    pipeline = Pipeline(Config(), load_table())
    events, last = [], None
    for tick in ticks:
        events += pipeline.update(tick)
        last = tick.t
    return events, last


def test_h200_torch_leaks_are_critical_within_60_s_one_episode_each():
    truth = json.loads((H200 / "h200-torch-leaks.truth.json").read_text())
    events, end = _replay(H200 / "h200-torch-leaks.jsonl.gz")
    leaks = [e for e in events if e.signal == "memory_leak"]
    for name in ("leak1", "leak3"):
        proc = truth["processes"][name]
        onset = next(p["t"] for p in proc["phases"] if p["what"] == "leak_start")
        mine = [e for e in leaks if e.pid == proc["pid"]]
        # one episode: one firing event, critical, no resolve while the leak goes on (leak1
        # leaks to the end; leak3 stops 80 s before the end, inside its 5 min hold)
        assert [(e.state, e.severity) for e in mine] == [("firing", "critical")], name
        latency = mine[0].t - onset
        assert 0 < latency <= 60, (name, latency)
        assert mine[0].value >= mine[0].threshold  # the value judged, and its entry level
    twin = truth["processes"]["twin"]["pid"]
    assert [e for e in events if e.pid == twin] == []
    assert [e for e in leaks if e.pid is None] == []  # the GPU's own series: nothing
    assert end is not None


@pytest.mark.parametrize("seed", [0, 1])
def test_second_trace_family_meets_the_goals(seed):
    for trace in leak_traces2.traces(seed):
        r = leak_traces2.score(trace, leak_traces2.run(trace, seed))
        assert r["false_alarms"] == 0, (trace.name, r)
        assert r["episodes_while_leaking"] <= 1, (trace.name, r)
        if trace.leak is None:
            continue
        assert r["latency"] is not None, (trace.name, r)
        assert r["latency"] <= trace.leak.goal_seconds, (trace.name, r)
