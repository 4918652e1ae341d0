"""The Remediator as the daemon drives it: policy defaults, opt-in, guardrails, dry run,
escalation, identity checks, snapshot files and the audit log."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import psutil
import pytest
from aiohttp import web

from gpuwatch.events import Event
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import EngineSample, GpuSample, ProbeSample, ProcessSample, Tick
from gpuwatch.remediation.audit import read_records
from gpuwatch.remediation.config import (
    AllowRule,
    AuditConfig,
    EscalationRule,
    ExecConfig,
    FlushConfig,
    RemediationConfig,
    SignalConfig,
    SnapshotConfig,
    WebhookConfig,
    WebhookRoute,
)
from gpuwatch.remediation.hooks import probe_channel
from gpuwatch.remediation.remediator import Remediator
from gpuwatch.signals.derived import Derived, ProcessSignals
from gpuwatch.thresholds.table import load_table
from tests.helpers import eventually

MIB, GIB = 1024**2, 1024**3
UUID = "GPU-11111111-2222-3333-4444-555555555555"
A100 = ("NVIDIA A100-SXM4-80GB", 81920 * MIB)
RTX4090 = ("NVIDIA GeForce RTX 4090", 24564 * MIB)


class Clock:
    def __init__(self, t: float = 10_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def snap_of(procs=((4242, 1000.0),), *, model=A100, lost=False, probes=(), engines=(),
            active=(), derived=None) -> Snapshot:
    gpu = GpuSample(
        index=0, uuid=UUID, name=model[0], memory_total_bytes=model[1],
        memory_used_bytes=int(model[1] * 0.95), lost=lost,
        processes=[ProcessSample(pid=pid, name="python3", used_memory_bytes=(i + 1) * GIB,
                                 create_time=ct) for i, (pid, ct) in enumerate(procs)],
    )
    tick = Tick(t=1.0, gpus=[gpu], probes=list(probes), engines=list(engines))
    return Snapshot(tick=tick, derived=derived or Derived(), active_events=tuple(active))


def ev(signal_="memory_leak", severity="critical", pid=4242, state="firing", uuid=UUID):
    return Event(t=1.0, signal=signal_, state=state, severity=severity, gpu_uuid=uuid, pid=pid,
                 value=6e7, threshold=5.2e7)


def make(tmp_path, *, clock=None, dry_run=False, webhook=None, table=None, **cfg):
    config = RemediationConfig(
        snapshot=cfg.pop("snapshot", SnapshotConfig(dir=str(tmp_path / "snaps"))),
        audit=AuditConfig(path=str(tmp_path / "audit.jsonl")), **cfg)
    return Remediator(config, webhook or WebhookConfig(), probe_dir=str(tmp_path / "probe"),
                      table=table, dry_run=dry_run, clock=clock or Clock())


async def step(rem, events, snap):
    out = await rem.on_events(events, snap)
    assert await rem.wait_idle(30)
    await asyncio.sleep(0)
    return out + rem.take_done()


def results(actions):
    return [(a.action, a.result) for a in actions]


def audit(tmp_path):
    return [r for r in read_records(tmp_path / "audit.jsonl") if "action" in r]


def snap_files(tmp_path):
    d = tmp_path / "snaps"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


# -- defaults -----------------------------------------------------------------------------


def test_default_critical_leak_snapshots_the_offending_process(tmp_path):
    async def go():
        rem = make(tmp_path)
        out = await step(rem, [ev()], snap_of(((4242, 1000.0), (77, 1001.0))))
        await rem.close()
        return rem, out
    rem, out = asyncio.run(go())
    assert results(out) == [("snapshot", "ok")]
    assert out[0].target == f"{UUID}/pid:4242" and out[0].trigger == "policy"
    [name] = snap_files(tmp_path)
    assert name.endswith("-pid4242-host-nvml.json")  # no such process: the host's
    path = tmp_path / "snaps" / name
    state = json.loads(path.read_text())
    assert state["target"]["pid"] == 4242
    assert {p["pid"] for p in state["gpu"]["processes"]} == {4242, 77}
    assert state["event"]["signal"] == "memory_leak"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "snaps").stat().st_mode) == 0o700
    records = audit(tmp_path)
    assert [r["result"] for r in records] == ["started", "ok"]
    assert records[0]["id"] == records[1]["id"]
    assert rem.counters()[("snapshot", "ok")] == 1
    assert sum(rem.counters().values()) == 1


def test_gpu_wide_leak_snapshots_the_fastest_leaker(tmp_path):
    derived = Derived()
    derived.processes[(UUID, 1)] = ProcessSignals(leak_rate_bytes_per_second=1e6)
    derived.processes[(UUID, 2)] = ProcessSignals(leak_rate_bytes_per_second=9e7)
    out = asyncio.run(step(make(tmp_path), [ev(pid=None)],
                           snap_of(((1, 5.0), (2, 6.0), (3, 7.0)), derived=derived)))
    assert results(out) == [("snapshot", "ok")]
    assert out[0].target == f"{UUID}/pid:2"


@pytest.mark.parametrize("event", [
    ev(severity="warning"),
    ev(signal_="kv_cache_hit_ratio"),
    ev(signal_="fragmentation"),
    ev(state="resolved"),
])
def test_nothing_else_acts_by_default(tmp_path, event):
    out = asyncio.run(step(make(tmp_path), [event], snap_of()))
    assert out == [] and snap_files(tmp_path) == []


def test_red_zone_follows_the_table_row(tmp_path):
    """RTX 4090's row: SIGUSR1 + allocation trace. Signal is opt-in, so out of the box it is
    refused (and audited) while the read-only snapshot with history runs."""
    zone = Event(t=1.0, signal="memory_zone", state="firing", severity="critical",
                 gpu_uuid=UUID)
    out = asyncio.run(step(make(tmp_path, table=load_table()), [zone], snap_of(model=RTX4090)))
    assert results(out) == [("signal", "refused"), ("snapshot", "ok")]
    assert "not enabled" in out[0].reason
    assert out[1].detail["plan"] == "table:rtx-4090" and out[1].detail["arg"] == "history"
    a100 = tmp_path / "a100"
    a100.mkdir()
    out = asyncio.run(step(make(a100, table=load_table()), [zone], snap_of(model=A100)))
    assert results(out) == [("snapshot", "ok")]
    assert out[0].detail["plan"] == "table:a100-80gb"


# -- opt-in -------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["flush", "signal", "exec"])
def test_invasive_actions_need_opt_in(action):
    raw = {"escalation": [{"signal": "memory_leak", "actions": ["snapshot", action]}]}
    with pytest.raises(msgspec.ValidationError, match=rf"remediation.{action}.enabled"):
        msgspec.convert(raw, RemediationConfig)
    webhook = WebhookConfig(token="t", routes=[WebhookRoute(actions=[action])])
    with pytest.raises(ValueError, match=rf"webhook.routes\[0\].*remediation.{action}.enabled"):
        webhook.check_against(RemediationConfig())


def test_config_errors_name_the_key():
    with pytest.raises(msgspec.ValidationError, match=r"escalation\[0\].actions\[0\]"):
        msgspec.convert({"escalation": [{"signal": "x", "actions": ["reboot"]}]},
                        RemediationConfig)
    with pytest.raises(msgspec.ValidationError, match=r"signal\.signal: unknown signal"):
        msgspec.convert({"signal": {"signal": "SIGNOPE"}}, RemediationConfig)
    with pytest.raises(msgspec.ValidationError, match=r"exec\.argv"):
        msgspec.convert({"exec": {"enabled": True}}, RemediationConfig)
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.convert({"cooldown": 5}, RemediationConfig)


# -- guardrails -----------------------------------------------------------------------------


def test_dry_run_performs_nothing_and_says_so(tmp_path):
    marker = tmp_path / "exec-ran"
    cfg = dict(
        exec=ExecConfig(enabled=True, argv=[sys.executable, "-c",
                                            f"open({str(marker)!r}, 'w').write('x')"]),
        escalation=[EscalationRule(signal="memory_leak", actions=["snapshot", "exec"],
                                   escalate_after_seconds=0)],
    )
    rem = make(tmp_path, dry_run=True, **cfg)
    out = asyncio.run(step(rem, [ev()], snap_of()))
    assert results(out) == [("snapshot", "dry_run"), ("exec", "dry_run")]
    assert out[1].detail["would_exec"][0] == sys.executable
    assert snap_files(tmp_path) == [] and not marker.exists()
    records = audit(tmp_path)
    assert [(r["action"], r["result"], r["dry_run"]) for r in records] == [
        ("snapshot", "dry_run", True), ("exec", "dry_run", True)]
    assert rem.counters()[("exec", "dry_run")] == 1


def test_config_dry_run_is_the_same_as_the_flag(tmp_path):
    config = RemediationConfig(dry_run=True, snapshot=SnapshotConfig(dir=str(tmp_path / "s")),
                               audit=AuditConfig(path=str(tmp_path / "audit.jsonl")))
    rem = Remediator(config, WebhookConfig(), probe_dir="", clock=Clock())
    out = asyncio.run(step(rem, [ev()], snap_of()))
    assert results(out) == [("snapshot", "dry_run")]


def test_cooldown_is_per_action_and_target(tmp_path):
    clock = Clock()

    async def go():
        rem = make(tmp_path, clock=clock, cooldown_seconds=600)
        snap = snap_of(((4242, 1.0), (5151, 2.0)))
        out = await step(rem, [ev()], snap)
        out += await step(rem, [ev(state="resolved")], snap)
        clock.t += 60
        out += await step(rem, [ev()], snap)  # same target, 60 s later
        out += await step(rem, [ev(pid=5151)], snap)  # another target
        clock.t += 600
        out += await step(rem, [ev(state="resolved"), ev()], snap)
        return out
    out = asyncio.run(go())
    assert results(out) == [("snapshot", "ok"), ("snapshot", "skipped_cooldown"),
                            ("snapshot", "ok"), ("snapshot", "ok")]
    assert "cooldown 600s" in out[1].reason
    assert [a.target.rsplit(":", 1)[1] for a in out] == ["4242", "4242", "5151", "4242"]


def test_global_rate_limit_over_a_window(tmp_path):
    clock = Clock()

    async def go():
        rem = make(tmp_path, clock=clock, rate_limit=2, rate_window_seconds=100,
                   cooldown_seconds=0, max_concurrent=5)
        snap = snap_of(((1, 1.0), (2, 2.0), (3, 3.0)))
        out = await step(rem, [ev(pid=1), ev(pid=2), ev(pid=3)], snap)
        clock.t += 101
        out += await step(rem, [ev(pid=3, severity="warning"), ev(pid=3)], snap)
        return rem, out
    rem, out = asyncio.run(go())
    # Decisions come back at once, results of the actions when they finish.
    assert results(out) == [("snapshot", "skipped_rate_limit")] + [("snapshot", "ok")] * 3
    assert "limit 2" in out[0].reason and out[0].target.endswith("pid:3")
    assert rem.counters()[("snapshot", "skipped_rate_limit")] == 1


def test_max_concurrent_actions(tmp_path):
    cfg = dict(
        max_concurrent=1, cooldown_seconds=0,
        exec=ExecConfig(enabled=True, argv=[sys.executable, "-c", "import time; time.sleep(1)"]),
        escalation=[EscalationRule(signal="memory_leak", actions=["exec"])],
    )

    async def go():
        rem = make(tmp_path, **cfg)
        snap = snap_of(((1, 1.0), (2, 2.0)))
        first = await rem.on_events([ev(pid=1)], snap)
        second = await rem.on_events([ev(pid=2)], snap)
        await rem.wait_idle(30)
        await asyncio.sleep(0)
        early = first + second + rem.take_done()
        return early, await step(rem, [ev(pid=2, severity="warning"), ev(pid=2)], snap)
    early, later = asyncio.run(go())
    assert results(early) == [("exec", "skipped_rate_limit"), ("exec", "ok")]
    assert "max_concurrent 1" in early[0].reason
    assert results(later) == [("exec", "ok")]


def test_lost_gpu_and_vanished_pid_are_refused(tmp_path):
    out = asyncio.run(step(make(tmp_path), [ev()], snap_of(lost=True)))
    assert results(out) == [("snapshot", "refused")] and "lost" in out[0].reason
    out = asyncio.run(step(make(tmp_path), [ev(pid=999)], snap_of()))
    assert results(out) == [("snapshot", "refused")]
    assert "no longer on GPU" in out[0].reason
    out = asyncio.run(step(make(tmp_path), [ev(uuid="GPU-gone")], snap_of()))
    assert "not in the latest sample" in out[0].reason
    assert snap_files(tmp_path) == []


def test_audit_failure_means_no_action(tmp_path):
    async def go():
        rem = make(tmp_path)
        # The "started" record cannot be had: as when the disk is full (the real full disk
        # is in test_remediation_faults.py).
        def broken(*args, **kwargs):
            raise OSError(28, "No space left on device")
        rem.ledger.started = broken
        out = await step(rem, [ev()], snap_of())
        await rem.close()
        return out
    out = asyncio.run(go())
    assert results(out) == [("snapshot", "refused")]
    assert "audit log not writable" in out[0].reason
    assert snap_files(tmp_path) == []


def test_a_failing_hook_is_reported_and_the_next_tick_goes_on(tmp_path):
    cfg = dict(exec=ExecConfig(enabled=True, argv=[sys.executable, "-c", "raise SystemExit(2)"]),
               escalation=[EscalationRule(signal="memory_leak", actions=["exec"])])

    async def go():
        rem = make(tmp_path, **cfg)
        out = await step(rem, [ev(pid=4242)], snap_of())
        out += await step(rem, [ev(signal_="memory_zone")], snap_of())
        return out
    out = asyncio.run(go())
    assert results(out) == [("exec", "failed"), ("snapshot", "ok")]
    assert "status 2" in out[0].reason


# -- escalation ---------------------------------------------------------------------------


def test_escalation_steps_while_the_condition_keeps_firing(tmp_path):
    marker = tmp_path / "escalated"
    clock = Clock()
    cfg = dict(
        cooldown_seconds=0,
        exec=ExecConfig(enabled=True, argv=[sys.executable, "-c",
                                            f"open({str(marker)!r}, 'a').write('x')"]),
        escalation=[EscalationRule(signal="memory_*", severity="critical", scope="process",
                                   actions=["snapshot", "exec"], escalate_after_seconds=60)],
    )
    firing = ev()

    async def go():
        rem = make(tmp_path, clock=clock, **cfg)
        active = snap_of(active=[firing])
        steps = [await step(rem, [firing], active)]
        clock.t += 30
        steps.append(await step(rem, [], active))
        clock.t += 31
        steps.append(await step(rem, [], active))
        clock.t += 120
        steps.append(await step(rem, [], active))  # the ladder has no third step
        # A new firing that resolves before its time does not escalate.
        other = ev(pid=5151)
        snap2 = snap_of(((4242, 1000.0), (5151, 3.0)), active=[other])
        steps.append(await step(rem, [other], snap2))
        clock.t += 30
        steps.append(await step(rem, [ev(pid=5151, state="resolved")], snap_of()))
        clock.t += 100
        steps.append(await step(rem, [], snap2))
        return steps
    steps = asyncio.run(go())
    assert [results(s) for s in steps] == [
        [("snapshot", "ok")], [], [("exec", "ok")], [], [("snapshot", "ok")], [], []]
    assert steps[2][0].detail["step"] == 1
    assert marker.read_text() == "x"


# -- signal through the policy, on a real process -------------------------------------------


CHILD = ("import signal, sys, time\n"
         "signal.signal(signal.SIGUSR1, lambda *a: open(sys.argv[1], 'a').write('usr1'))\n"
         "print('ready', flush=True)\ntime.sleep(60)\n")


def test_policy_signals_a_real_allowed_process_and_refuses_a_reused_pid(tmp_path):
    got = tmp_path / "got"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(got), "worker-under-test"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        ct = psutil.Process(child.pid).create_time()
        cfg = dict(
            cooldown_seconds=0,
            signal=SignalConfig(enabled=True, allow=[AllowRule(cmdline="worker-under-test")]),
            escalation=[EscalationRule(signal="memory_leak", actions=["signal"])],
        )

        async def go():
            rem = make(tmp_path, **cfg)
            bad = await step(rem, [ev(pid=child.pid)], snap_of(((child.pid, ct - 5.0),)))
            time.sleep(0.3)
            before = got.exists()
            good = await step(rem, [ev(pid=child.pid, severity="warning"), ev(pid=child.pid)],
                              snap_of(((child.pid, ct),)))
            return bad, before, good
        bad, before, good = asyncio.run(go())
        assert results(bad) == [("signal", "refused")] and "pid reused" in bad[0].reason
        assert not before
        assert results(good) == [("signal", "ok")]
        assert eventually(got.exists)  # the child writes what it received
        assert got.read_text() == "usr1"
    finally:
        child.kill()
        child.wait()


# -- snapshot files -------------------------------------------------------------------------


def test_snapshot_dir_is_capped_oldest_first(tmp_path):
    d = tmp_path / "snaps"
    d.mkdir(mode=0o755)
    now = time.time()
    for i in range(5):
        p = d / f"gpuwatch-old-{i}.json"
        p.write_bytes(b"x" * 1000)
        os.utime(p, (now - 1000 + i, now - 1000 + i))
    (d / "notes.txt").write_bytes(b"y" * 5000)  # not ours: never counted or deleted
    rem = make(tmp_path, snapshot=SnapshotConfig(dir=str(d), max_total_bytes=3500))
    out = asyncio.run(step(rem, [ev()], snap_of()))
    assert results(out) == [("snapshot", "ok")]
    names = snap_files(tmp_path)
    assert "notes.txt" in names
    ours = [n for n in names if n.startswith("gpuwatch-")]
    assert sum((d / n).stat().st_size for n in ours) <= 3500
    assert out[0].detail["deleted_for_cap"][0] == "gpuwatch-old-0.json"
    assert "gpuwatch-old-4.json" in names or len(ours) == 1
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_snapshot_asks_the_probe_when_the_process_has_one(tmp_path, monkeypatch):
    """The probe writes its pickle in its own directory; gpuwatch copies it under its own name
    and mode. (The probe itself is exercised in test_remediation_probe.py.)"""
    calls = []

    async def fake_request(probe_dir, pid, action, params, timeout):
        calls.append((pid, action, params))
        return {"ok": True, "path": "/etc/shadow", "segments": 7, "history": True,
                "request_id": "0123456789abcdef"}

    async def fake_copy(probe_dir, pid, request_id, dest, max_bytes):
        calls.append((pid, request_id))
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"\x80\x04N.")
        os.close(fd)
        return 5
    monkeypatch.setattr(probe_channel, "request", fake_request)
    monkeypatch.setattr(probe_channel, "copy_snapshot", fake_copy)
    probes = [ProbeSample(pid=4242, create_time=1000.0, reserved_bytes=GIB)]
    rem = make(tmp_path, snapshot=SnapshotConfig(dir=str(tmp_path / "snaps"), history=True))
    out = asyncio.run(step(rem, [ev()], snap_of(probes=probes)))
    assert results(out) == [("snapshot", "ok")]
    # No directory offered to the probe, and its "path" is not looked at.
    assert calls == [(4242, "snapshot", {"history": True}), (4242, "0123456789abcdef")]
    pickle_path = out[0].detail["allocator_snapshot"]
    assert pickle_path.endswith("-pid4242-host-allocator.pickle") and out[0].detail["segments"] == 7
    assert stat.S_IMODE(os.stat(pickle_path).st_mode) == 0o600
    # A probe record left by an earlier process with the same pid is not this process's.
    stale = [ProbeSample(pid=4242, create_time=500.0)]
    calls.clear()
    other = tmp_path / "other"
    other.mkdir()
    out = asyncio.run(step(make(other), [ev()], snap_of(probes=stale)))
    assert results(out) == [("snapshot", "ok")] and calls == []


def test_probe_timeout_fails_but_keeps_the_nvml_state(tmp_path, monkeypatch):
    async def silent(probe_dir, pid, action, params, timeout):
        raise probe_channel.HookFailed(f"probe in pid {pid} did not answer within 1s")
    monkeypatch.setattr(probe_channel, "request", silent)
    rem = make(tmp_path)
    out = asyncio.run(step(rem, [ev()], snap_of(probes=[ProbeSample(pid=4242)])))
    assert results(out) == [("snapshot", "failed")]
    assert "did not answer" in out[0].reason
    assert os.path.exists(out[0].detail["nvml_state"])


# -- flush -------------------------------------------------------------------------------


def test_flush_via_probe_reports_released_bytes(tmp_path, monkeypatch):
    async def fake_request(probe_dir, pid, action, params, timeout):
        assert action == "flush"
        return {"ok": True, "released_bytes": 5 * GIB, "reserved_before": 6 * GIB,
                "reserved_after": GIB}
    monkeypatch.setattr(probe_channel, "request", fake_request)
    cfg = dict(flush=FlushConfig(enabled=True),
               escalation=[EscalationRule(signal="memory_leak", actions=["flush"])])
    out = asyncio.run(step(make(tmp_path, **cfg), [ev()],
                           snap_of(probes=[ProbeSample(pid=4242, create_time=1000.0)])))
    assert results(out) == [("flush", "ok")]
    assert out[0].detail["released_bytes"] == 5 * GIB and out[0].detail["via"] == "probe"


def test_flush_without_probe_or_endpoint_is_refused(tmp_path):
    cfg = dict(flush=FlushConfig(enabled=True),
               escalation=[EscalationRule(signal="memory_leak", actions=["flush"])])
    out = asyncio.run(step(make(tmp_path, **cfg), [ev()], snap_of()))
    assert results(out) == [("flush", "refused")] and "nothing to flush" in out[0].reason


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def test_flush_via_engine_endpoints(tmp_path):
    """A vLLM-like server that flushes, an SGLang-like one that is busy (400), and a vLLM
    without dev mode (404): real HTTP on loopback."""
    seen = []

    async def vllm_reset(request):
        seen.append((request.path, request.headers.get("Authorization")))
        return web.Response(status=200)

    async def sglang_flush(request):
        seen.append((request.path, None))
        return web.Response(status=400, text="Cache not flushed: requests are running")

    async def go():
        app = web.Application()
        app.router.add_post("/reset_prefix_cache", vllm_reset)
        app.router.add_post("/flush_cache", sglang_flush)
        runner, base = await _serve(app)
        runner2, nodev = await _serve(web.Application())
        engines = [
            EngineSample(name="vllm-0", kind="vllm", url=f"{base}/metrics", pids=[1]),
            EngineSample(name="sglang-0", kind="sglang", url=f"{base}/metrics", pids=[2]),
            EngineSample(name="vllm-nodev", kind="vllm", url=f"{nodev}/metrics", pids=[3]),
        ]
        cfg = dict(flush=FlushConfig(enabled=True, http_timeout_seconds=3), cooldown_seconds=0,
                   max_concurrent=3,
                   escalation=[EscalationRule(signal="memory_leak", actions=["flush"])])
        rem = make(tmp_path, **cfg)
        snap = snap_of(((1, 1.0), (2, 2.0), (3, 3.0)), engines=engines)
        out = await step(rem, [ev(pid=1), ev(pid=2), ev(pid=3)], snap)
        await rem.close()
        await runner.cleanup()
        await runner2.cleanup()
        return out
    out = asyncio.run(go())
    by_pid = {a.target.rsplit(":", 1)[1]: a for a in out}
    assert by_pid["1"].result == "ok" and by_pid["1"].detail["via"] == "engine"
    assert by_pid["1"].detail["url"].endswith("/reset_prefix_cache")
    assert by_pid["2"].result == "failed"
    assert "SGLang refuses to flush while requests are running" in by_pid["2"].reason
    assert by_pid["3"].result == "failed" and "VLLM_SERVER_DEV_MODE=1" in by_pid["3"].reason
    assert sorted(p for p, _ in seen) == ["/flush_cache", "/reset_prefix_cache"]


def test_counters_cover_every_result(tmp_path):
    rem = make(tmp_path)
    counts = rem.counters()
    assert len(counts) == 4 * 6 and set(counts.values()) == {0}
    asyncio.run(step(rem, [ev()], snap_of()))
    assert rem.counters()[("snapshot", "ok")] == 1


def test_signal_constants_match():
    # The config accepts names with or without SIG and numbers.
    from gpuwatch.remediation.config import signal_number
    assert signal_number("SIGUSR1") == signal_number("usr1") == signal.SIGUSR1
    assert signal_number(str(int(signal.SIGTERM))) == signal.SIGTERM


# -- out of the box -----------------------------------------------------------------------


def test_out_of_the_box_only_read_only_actions_run(tmp_path):
    """Every signal, severity and scope, on a calibrated and a derived GPU model, with no
    configuration: nothing but snapshots is performed."""
    from gpuwatch.events import SIGNALS

    events = [Event(t=1.0, signal=s, state="firing", severity=sev, gpu_uuid=UUID, pid=pid)
              for s in SIGNALS for sev in ("warning", "critical") for pid in (4242, None)]

    async def go(model):
        rem = make(tmp_path / model[0].replace(" ", "_"), table=load_table(), cooldown_seconds=0,
                   rate_limit=1000, max_concurrent=1000)
        return await step(rem, events, snap_of(model=model))
    performed = set()
    for model in (A100, RTX4090, ("NVIDIA H200", 143771 * MIB)):
        for a in asyncio.run(go(model)):
            assert a.action == "snapshot" or a.result == "refused", a
            if a.result == "ok":
                performed.add(a.detail["signal"])
    assert performed == {"memory_leak", "memory_zone"}


def test_planned_actions_for_replay_are_pure():
    from gpuwatch.remediation.policy import Policy, planned_actions

    policy = Policy(RemediationConfig(), load_table())
    zone = Event(t=5.0, signal="memory_zone", state="firing", severity="critical",
                 gpu_uuid=UUID)
    snap = snap_of(model=RTX4090)
    first = planned_actions(policy, [ev(), zone, ev(severity="warning")], snap)
    again = planned_actions(policy, [ev(), zone, ev(severity="warning")], snap)
    assert [msgspec.to_builtins(a) for a in first] == [msgspec.to_builtins(a) for a in again]
    assert [(a.action, a.result, a.t) for a in first] == [
        ("snapshot", "dry_run", 1.0), ("signal", "dry_run", 5.0), ("snapshot", "dry_run", 5.0)]
    assert first[1].detail["arg"] == "SIGUSR1" and first[2].detail["arg"] == "history"


def test_disabled_remediation_does_nothing(tmp_path):
    rem = make(tmp_path, enabled=False)
    out = asyncio.run(step(rem, [ev()], snap_of()))
    assert out == [] and snap_files(tmp_path) == []
    assert sum(rem.counters().values()) == 0


def test_default_state_dir_follows_systemd(monkeypatch, tmp_path):
    from gpuwatch.remediation.remediator import state_dir

    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/gpuwatch:/elsewhere")
    assert state_dir() == tmp_path / "gpuwatch"
    monkeypatch.delenv("STATE_DIRECTORY")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    expected = Path("/var/lib/gpuwatch") if os.geteuid() == 0 else tmp_path / "xdg" / "gpuwatch"
    assert state_dir() == expected


def test_a_hostile_probe_answer_is_typed_and_cut_short(tmp_path, monkeypatch):
    """What a probe answers is its user's text: only typed, short facts reach the audit log."""
    answers = [{"ok": True, "released_bytes": "9" * 10_000, "reserved_before": [1] * 1000,
                "reserved_after": 5},
               {"ok": False, "error": "e" * 100_000}]

    async def fake_request(probe_dir, pid, action, params, timeout):
        return answers.pop(0)
    monkeypatch.setattr(probe_channel, "request", fake_request)
    probes = [ProbeSample(pid=4242, create_time=1000.0, reserved_bytes=GIB)]
    cfg = dict(cooldown_seconds=0, flush=FlushConfig(enabled=True),
               escalation=[EscalationRule(signal="memory_leak", actions=["flush"])])

    async def go():
        rem = make(tmp_path, **cfg)
        out = await step(rem, [ev()], snap_of(probes=probes))
        out += await step(rem, [ev()], snap_of(probes=probes))
        await rem.close()
        return out
    ok, failed = asyncio.run(go())
    assert (ok.result, failed.result) == ("ok", "failed")
    assert ok.detail["reserved_after"] == 5
    assert "released_bytes" not in ok.detail and "reserved_before" not in ok.detail
    assert len(failed.reason) < 400
    assert max(len(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()) < 2000
