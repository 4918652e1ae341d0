"""Replay runs the live daemon's analyzers and policy: same recording, same events."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import child_env, wait_until

pytestmark = pytest.mark.integration


def replay(path, *args) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "gpuwatch", "replay", str(path), "--json", *args],
                         capture_output=True, text=True, timeout=120, env=child_env(),
                         check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_live_events_equal_replayed_events(daemon, tmp_path):
    rec, log = tmp_path / "leak.jsonl.gz", tmp_path / "events.jsonl"
    d = daemon("--simulate", "leak", "--record", str(rec), "--events-log", str(log),
               env={"GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "1"})

    def leak_fired_and_acted_on():
        return log.exists() and '"memory_leak"' in log.read_text() and (
            '"action":"snapshot"' in log.read_text())

    wait_until(leak_fired_and_acted_on, 120, interval=1,
               what="the simulated leak to be flagged and snapshotted")
    state = d.state()
    d.stop()
    live = [json.loads(line) for line in log.read_text().splitlines()]
    live_signals = [e for e in live if "signal" in e]
    assert any(e["signal"] == "memory_leak" and e["severity"] == "critical"
               and e["pid"] == 41000 for e in live_signals)
    # /api/state shows the very events the log holds (immutable: same id, same content)
    by_id = {e["id"]: e for e in live_signals}
    shown = [e for e in state["recent_events"] + state["active_events"] if "signal" in e]
    assert shown and all(by_id[e["id"]] == e for e in shown)

    assert replay(rec, "--no-actions") == live_signals
    replayed = replay(rec)
    assert replayed == replay(rec)  # deterministic
    planned = {(e["action"], e["target"]) for e in replayed if "action" in e}
    performed = {(e["action"], e["target"]) for e in live if "action" in e}
    assert ("snapshot", next(iter(performed))[1]) in planned  # the default policy's snapshot
    assert performed <= planned


def test_replay_rejects_what_is_not_a_recording(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text("hello\n")
    r = subprocess.run([sys.executable, "-m", "gpuwatch", "replay", str(bad)], capture_output=True,
                       text=True, timeout=60, env=child_env())
    assert r.returncode == 2 and "line 1" in r.stderr
