"""Leak detection on recorded traces: real torch processes on an H200 (real NVML, 1 s ticks)
and the second, independently written family of synthetic traces (benchmarks/leak_traces2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import leak_replay, leak_traces2

H200 = Path(__file__).parent / "fixtures" / "traces" / "h200"
# recordings whose judge fails today, and why (strict: a fix must remove the entry)
KNOWN_MISSES: dict[str, str] = {}
TRUTHS = [
    pytest.param(p, id=p.name.removesuffix(".truth.json"), marks=[pytest.mark.xfail(
        strict=True, reason=KNOWN_MISSES[name])] if (
        name := p.name.removesuffix(".truth.json")) in KNOWN_MISSES else [])
    for p in sorted(H200.glob("h200-*.truth.json"))]


@pytest.mark.parametrize("truth", TRUTHS)
def test_every_recorded_h200_trace_meets_the_targets(truth):
    """Any recording of tests/gpu/record_traces.py dropped here is judged from its truth:
    each leak within the issue's target (where the recording lasted that long), every other
    process quiet, the GPU's own series quiet, and the time to OOM before the GPU's wall."""
    r = leak_replay.score(str(truth).replace(".truth.json", ".jsonl.gz"), str(truth))
    text = leak_replay.report(r)
    assert [v for v in r["processes"] if not v.ok] == [], text
    assert [v for v in r["processes"] if v.outcome == "met"], text  # something was due
    assert r["gpu_leak_events"] == [], text
    if r["first_oom"] is not None:
        assert r["time_to_oom_before_oom"], text


def test_the_fill_trace_raises_time_to_oom_before_the_wall():
    """h200-fill: ten torch processes filled the GPU from 63 to 134 GiB in 160 s; time to OOM
    fires at least 30 s before the wall. (Most of that fill was `slowload` and `ratchet`
    growing from their start, which the GPU's projection leaves out as loading for
    loading_max_seconds: a load is no pace to project. The leaks judged on the GPU raise it.)"""
    r = leak_replay.score(str(H200 / "h200-fill.jsonl.gz"), str(H200 / "h200-fill.truth.json"))
    assert r["time_to_oom"] and r["time_to_oom"][0] < r["first_oom"] - 30
    message = r["time_to_oom_messages"][0]
    assert message.startswith("GPU 0 runs out of its memory budget in ")
    by_name = {v.name: v for v in r["processes"] if v.kind == "leak"}
    assert {n for n, v in by_name.items() if v.outcome == "met"} >= {
        "leak2", "leak20", "leak40", "step"}


def test_h200_torch_leaks_are_critical_within_60_s_one_episode_each():
    r = leak_traces2.recorded(str(H200 / "h200-torch-leaks.jsonl.gz"),
                              str(H200 / "h200-torch-leaks.truth.json"))
    for name in ("leak1", "leak3"):
        # one episode: one firing event, critical, no resolve while the leak goes on (leak1
        # leaks to the end; leak3 stops 80 s before the end, inside its hold)
        events = r[name]["events"]
        assert [(e.state, e.severity) for e in events] == [("firing", "critical")], name
        assert 0 < r[name]["latency"] <= 60, (name, r[name]["latency"])
        assert events[0].value >= events[0].threshold  # the value judged, and its entry level
    assert r["twin"]["events"] == []
    assert r["gpu_series_events"] == []  # the GPU's own series: nothing


# seed 9 was over its goal until the series' first block (cut short by its start) stopped
# being judged; seeds 1 and 7 (31.7-32.4 min in the training loop) until a fall from a point
# whose window the series' start cut short stopped counting as its noise: their traces start
# during a checkpoint, which the floor gave back before its window had seen a return
@pytest.mark.parametrize("seed", [0, 1, 7, 9])
def test_second_trace_family_meets_the_goals(seed):
    for trace in leak_traces2.traces(seed):
        r = leak_traces2.score(trace, leak_traces2.run(trace, seed))
        assert r["false_alarms"] == 0, (trace.name, r)
        assert r["episodes_while_leaking"] <= 1, (trace.name, r)
        if trace.leak is None:
            continue
        assert r["latency"] is not None, (trace.name, r)
        assert r["latency"] <= trace.leak.goal_seconds, (trace.name, r)
