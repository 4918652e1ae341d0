"""A pid reused after the sample is never signalled. The reuse is real: after the sampled
process exits, the kernel's last-pid counter (/proc/sys/kernel/ns_last_pid, root only) is
set so that the next child gets the same pid, within milliseconds."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import psutil
import pytest

from gpuwatch.remediation import identity
from gpuwatch.remediation.config import AllowRule, EscalationRule, SignalConfig
from gpuwatch.remediation.hooks import Refused
from gpuwatch.remediation.hooks import signal as signal_hook
from tests.test_remediation_remediator import ev, make, results, snap_of, step

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
can_reuse = os.geteuid() == 0 and os.access(NS_LAST_PID, os.W_OK)
needs_reuse = pytest.mark.skipif(not can_reuse, reason="needs root to set ns_last_pid")
ALLOW = [AllowRule(name="sleep")]
# The create-time tolerance the identity check had: reuse within it was signalled.
OLD_TOLERANCE = 0.05


def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def reuse(pid: int, attempts: int = 200) -> subprocess.Popen | None:
    """A new process with this (free) pid; None when other forks kept winning the race."""
    for _ in range(attempts):
        with open(NS_LAST_PID, "w") as f:
            f.write(str(pid - 1))
        p = sleeper()
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


def gone(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait()


@needs_reuse
def test_a_pid_reused_within_milliseconds_is_never_signalled(tmp_path):
    cfg = dict(cooldown_seconds=0, signal=SignalConfig(enabled=True, allow=ALLOW),
               escalation=[EscalationRule(signal="memory_leak", actions=["signal"])])
    gaps = []

    async def attempt(n: int):
        a = sleeper()
        ct = psutil.Process(a.pid).create_time()
        rem = make(tmp_path / str(n), **cfg)
        snap = snap_of(((a.pid, ct),))
        await rem.on_events([], snap)  # the tick that first sees it
        gone(a)
        b = reuse(a.pid)
        if b is None:
            await rem.close()
            return None
        try:
            gaps.append(psutil.Process(b.pid).create_time() - ct)
            # The alert about the process that was sampled arrives now: its pid is b's.
            out = await step(rem, [ev(pid=a.pid)], snap)
            time.sleep(0.2)
            return out, b.poll()
        finally:
            gone(b)
            await rem.close()

    tried = 0
    while tried < 5:
        got = asyncio.run(attempt(tried))
        tried += 1
        if got is None:
            continue
        out, exit_status = got
        assert exit_status is None, "the process that took the pid was signalled"
        assert results(out) in ([("signal", "refused")], [("signal", "failed")]), out
        assert "reused" in out[0].reason or "exited" in out[0].reason, out[0].reason
        if gaps[-1] < OLD_TOLERANCE:
            break  # a reuse tighter than what the create-time check used to let through
    assert gaps, "no pid could be reused"
    print(f"pid reuse gaps: {[round(g * 1e3, 1) for g in gaps]} ms")


@needs_reuse
def test_without_a_held_pidfd_the_start_time_tells_them_apart():
    for _ in range(5):
        a = sleeper()
        ct = psutil.Process(a.pid).create_time()
        gone(a)
        time.sleep(0.02)  # two clock ticks later: what the start time alone can tell apart
        b = reuse(a.pid)
        if b is None:
            continue
        try:
            if identity.start_ticks(b.pid) == identity.ticks_of(ct):
                continue  # both in one clock tick: the documented limit of this fall-back
            with pytest.raises(Refused, match="pid reused"):
                signal_hook.send(b.pid, ct, signal.SIGTERM, ALLOW)
            time.sleep(0.1)
            assert b.poll() is None
            return
        finally:
            gone(b)
    pytest.fail("no pid reuse outside one clock tick could be arranged")


def test_start_ticks_reads_field_22_after_any_comm(tmp_path):
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    # comm may hold spaces and parentheses; field 22 is the 20th after the last ')'.
    fields = ["S"] + [str(i) for i in range(4, 22)] + ["987654"] + ["0"] * 30
    (proc / "stat").write_text(f"4242 (evil) 1 2 (x) {' '.join(fields)}\n")
    assert identity.start_ticks(4242, str(tmp_path / "proc")) == 987654
    assert identity.start_ticks(4243, str(tmp_path / "proc")) is None


def test_own_start_time_round_trips_through_psutil():
    me = psutil.Process()
    assert identity.start_ticks(me.pid) == identity.ticks_of(me.create_time())
    assert identity.same_process(me.pid, me.create_time()) is True
    assert identity.same_process(me.pid, me.create_time() - 0.011) is False  # one tick off


def test_handles_are_closed_when_processes_leave():
    handles = identity.ProcessHandles()
    a = sleeper()
    try:
        ct = psutil.Process(a.pid).create_time()
        handles.observe([(a.pid, ct)])
        fd = handles.dup(a.pid, ct)
        assert fd is not None
        os.close(fd)
        with pytest.raises(LookupError):  # sampled with another start time: not that one
            handles.observe([(a.pid, ct), (a.pid, ct - 5)])
            handles.dup(a.pid, ct - 5)
        handles.observe([])
        assert len(handles) == 0 and handles.dup(a.pid, ct) is None
    finally:
        gone(a)
        handles.close()
