"""A human start: the startup summary, one human log line per event (JSON stays in the events
log), replay's text output, IPv6 URLs, and what /readyz means without a GPU."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest

from gpuwatch.events import ActionEvent, Event
from gpuwatch.logfmt import human_line, listen_url
from tests.helpers import child_env, eventually, free_port, http_get

T = 1764489600.0  # 2025-11-30T08:00:00Z


def test_event_line_has_time_severity_signal_target_value_threshold_message():
    ev = Event(t=T, signal="memory_leak", state="firing", severity="critical",
               gpu_uuid="GPU-1", pid=4242, value=52428800.0 * 1.05, threshold=52428800.0,
               message="process 4242 keeps 52 MiB/s")
    line = human_line(ev)
    assert line == ("2025-11-30T08:00:00Z CRITICAL memory_leak firing | gpu GPU-1, pid 4242 | "
                    "52.5 MiB/s > threshold 50 MiB/s | process 4242 keeps 52 MiB/s")
    zone = Event(t=T, signal="memory_zone", state="firing", gpu_uuid="GPU-3",
                 value=18611 * 2**20 + 5, threshold=17500 * 2**20)
    assert "18611 MiB > threshold 17500 MiB" in human_line(zone)
    assert "e+" not in human_line(zone)
    kv = Event(t=T, signal="kv_cache_hit_ratio", state="resolved", engine="vllm-0", value=0.15,
               threshold=0.2)
    assert "| engine vllm-0 | 0.15 < threshold 0.2" in human_line(kv)


def test_action_line():
    a = ActionEvent(t=T, action="snapshot", target="pid 4242 on GPU-1", result="dry_run",
                    reason="dry run", trigger="policy")
    assert human_line(a) == ("2025-11-30T08:00:00Z action snapshot pid 4242 on GPU-1 -> "
                             "dry_run (from policy): dry run")


@pytest.mark.parametrize(("host", "url"), [("::1", "http://[::1]:19500/"),
                                           ("", "http://0.0.0.0:19500/"),
                                           ("127.0.0.1", "http://127.0.0.1:19500/")])
def test_listen_urls_bracket_ipv6(host, url):
    assert listen_url(host, 19500) == url


@pytest.mark.integration
def test_startup_summary_human_events_and_replay_text(daemon, tmp_path):
    log, rec = tmp_path / "events.jsonl", tmp_path / "mixed.jsonl"
    d = daemon("--simulate", "mixed", "--events-log", str(log), "--record", str(rec),
               "--dry-run", env={"GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "0.5"})
    # mixed's first event: the fragmenting allocator (nothing in mixed is in a memory zone)
    assert eventually(lambda: log.exists() and "fragmentation" in log.read_text(), 60)
    d.stop()
    out = d.output()
    summary = [line.split("gpuwatch: ", 1)[1] for line in out.splitlines()
               if "gpuwatch: " in line]
    assert "configuration from defaults (no file)" in summary[summary.index(next(
        s for s in summary if s.startswith("gpuwatch ")))]
    assert any(re.search(r"GPU 0: NVIDIA A100-SXM4-80GB, 81920 MiB, calibrated row a100-80gb: "
                         r"warning > 62000 MiB, critical > 73500 MiB", s) for s in summary)
    assert any(s.startswith("GPU 2: NVIDIA L40S") and "derived row" in s for s in summary)
    assert any("remediation on (hooks: snapshot), dry-run on" in s for s in summary)
    assert any(s.startswith("engines configured: none") for s in summary)
    assert any(s.startswith(f"serving on {d.url}/") for s in summary)
    assert any(s.startswith("state ") and "audit log" in s and str(log) in s for s in summary)
    # Events: one human line each in the log, JSON only in the events log.
    events = [json.loads(line) for line in log.read_text().splitlines()]
    frag = [e for e in events if e.get("signal") == "fragmentation"]
    human = [line for line in out.splitlines() if " fragmentation firing | " in line]
    assert len(human) == len([e for e in frag if e["state"] == "firing"]) >= 1
    assert '{"' not in out  # no raw JSON in the log
    actions = [e for e in events if "action" in e]
    assert len([line for line in out.splitlines() if " action " in line]) == len(actions)
    # Replay's text output is the same line, ISO times and the message included.
    r = subprocess.run([sys.executable, "-m", "gpuwatch", "replay", "--no-actions", str(rec)],
                       capture_output=True, text=True, timeout=120, env=child_env())
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ WARNING fragmentation firing \| gpu GPU-",
                    first), first
    assert "< threshold 0.6" in first and "allocator fragmented" in first
    # the live line: the same, after the log's own (one) time, at the event's severity
    assert first.split(" ", 1)[1] in {line.split("gpuwatch: ", 1)[1] for line in human}
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z"
    for line in human:
        assert len(re.findall(stamp, line)) == 1, line
        level, severity = re.match(rf"{stamp} (\w+) gpuwatch: (\w+) ", line).groups()
        assert level == severity, line


def _run(tmp_path, *args):
    from tests.helpers import Proc
    port = free_port()
    p = Proc([sys.executable, "-m", "gpuwatch", "run", "--listen", f"127.0.0.1:{port}", *args],
             tmp_path, f"d{port}", env=child_env(STATE_DIRECTORY=str(tmp_path / f"s{port}"),
                                                 GPUWATCH_NVML_FAST_INTERVAL_SECONDS="0.5"))
    return p, f"http://127.0.0.1:{port}"


@pytest.mark.integration
def test_readiness_without_a_gpu(tmp_path):
    """No NVML here: ready with nvml listed as degraded; not ready with --require-gpu."""
    plain, url = _run(tmp_path)
    strict, strict_url = _run(tmp_path, "--require-gpu")
    try:
        assert eventually(lambda: "serving on" in plain.output(), 30)
        assert eventually(lambda: "serving on" in strict.output(), 30)
        code, body = http_get(url + "/readyz")
        assert code == 200 and b"degraded nvml: " in body
        code, body = http_get(strict_url + "/readyz")
        assert code == 503 and b"--require-gpu" in body
        out = plain.output()
        assert out.count("--simulate mixed") == 1  # the hint, once
    finally:
        plain.stop()
        strict.stop()


@pytest.mark.integration
def test_ipv6_url_is_bracketed(daemon, tmp_path):
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    port = free_port()
    from tests.helpers import Proc
    p = Proc([sys.executable, "-m", "gpuwatch", "run", "--simulate", "steady", "--listen",
              f"[::1]:{port}"], tmp_path, "v6", env=child_env(
                  STATE_DIRECTORY=str(tmp_path / "s")))
    try:
        assert eventually(lambda: "serving on" in p.output(), 30), p.output()
        assert f"serving on http://[::1]:{port}/" in p.output()
    finally:
        p.stop()


def test_every_event_carries_its_severity_and_iso_times():
    from gpuwatch.events import as_dict, to_json
    from gpuwatch.exporter.snapshot import Snapshot
    from gpuwatch.exporter.state_json import state_document
    from gpuwatch.signals.conditions import Conditions

    warning = Event(t=T, signal="memory_zone", state="firing", gpu_uuid="GPU-3")
    assert json.loads(to_json(warning))["severity"] == "warning"
    assert list(as_dict(warning))[:4] == ["t", "signal", "state", "severity"]
    c = Conditions()
    (fired,) = c.set(T, warning, warning.key)
    (resolved,) = c.set(T + 90, None, warning.key)
    assert "fired at 2025-11-30T08:00:00Z" in resolved.message
    state = state_document(Snapshot(active_events=(fired,), recent_events=(fired, resolved)))
    assert [e["severity"] for e in state["active_events"] + state["recent_events"]] == [
        "warning"] * 3
