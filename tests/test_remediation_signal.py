"""The signal hook against real child processes: delivery, identity (pid reuse), allow-list."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpuwatch.remediation.config import AllowRule
from gpuwatch.remediation.hooks import Refused
from gpuwatch.remediation.hooks import signal as signal_hook

# The child writes one line per SIGUSR1/SIGUSR2 it receives.
CHILD = """
import signal, sys, time
out = sys.argv[1]
def note(num, frame):
    with open(out, "a") as f:
        f.write(signal.Signals(num).name + "\\n")
signal.signal(signal.SIGUSR1, note)
signal.signal(signal.SIGUSR2, note)
print("ready", flush=True)
time.sleep(120)
"""
MARKER = "gpuwatch-signal-test-child"


class Child:
    def __init__(self, tmp_path: Path, tag: str = "a") -> None:
        self.out = tmp_path / f"received-{tag}.txt"
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(self.out), MARKER],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid
        self.create_time = psutil.Process(self.pid).create_time()

    def received(self, timeout: float = 5.0, expect: int = 1) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.out.read_text().split() if self.out.exists() else []
            if len(lines) >= expect:
                return lines
            time.sleep(0.02)
        return self.out.read_text().split() if self.out.exists() else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def child(tmp_path):
    children: list[Child] = []

    def make(tag: str = "a") -> Child:
        c = Child(tmp_path, tag)
        children.append(c)
        return c

    yield make
    for c in children:
        c.stop()


ALLOW = [AllowRule(cmdline=MARKER)]


def test_signal_reaches_the_process(child):
    c = child()
    detail = signal_hook.send(c.pid, c.create_time, signal.SIGUSR1, ALLOW)
    assert c.received() == ["SIGUSR1"]
    assert detail["signal"] == "SIGUSR1" and detail["pid"] == c.pid
    assert detail["pidfd"] == hasattr(os, "pidfd_open")
    assert detail["allowed_by"] == {"cmdline": MARKER}


def test_configured_signal_other_than_usr1(child):
    c = child()
    signal_hook.send(c.pid, c.create_time, signal.SIGUSR2, ALLOW)
    assert c.received() == ["SIGUSR2"]


def test_without_pidfd_falls_back_to_kill(child, monkeypatch):
    c = child()
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    detail = signal_hook.send(c.pid, c.create_time, signal.SIGUSR1, ALLOW)
    assert detail["pidfd"] is False
    assert c.received() == ["SIGUSR1"]


def test_reused_pid_is_refused(child):
    """A pid now held by another process (its create time differs) is never signalled."""
    first = child("first")
    old_identity = (first.pid, first.create_time)
    first.stop()
    second = child("second")
    # Whether or not the kernel reused the number, the identity recorded for the first
    # process must not let the second one be signalled.
    with pytest.raises(Refused, match="no longer"):
        signal_hook.send(second.pid, old_identity[1] - 3.0, signal.SIGUSR1, ALLOW)
    with pytest.raises(Refused):
        signal_hook.send(*old_identity, signal.SIGUSR1, ALLOW)
    assert second.received(timeout=0.5) == []
    assert second.proc.poll() is None


def test_exited_process_is_refused(child):
    c = child()
    c.stop()
    with pytest.raises(Refused, match="no longer exists"):
        signal_hook.send(c.pid, c.create_time, signal.SIGUSR1, ALLOW)


def test_missing_create_time_is_refused(child):
    c = child()
    with pytest.raises(Refused, match="identity cannot be checked"):
        signal_hook.send(c.pid, None, signal.SIGUSR1, ALLOW)
    assert c.received(timeout=0.3) == []


@pytest.mark.parametrize("rules", [
    [],
    [AllowRule(cmdline="some-other-program")],
    [AllowRule(name="vllm*")],
    [AllowRule(cmdline=MARKER, user="no-such-user-here")],
])
def test_allow_list_refuses_what_it_does_not_name(child, rules):
    c = child()
    with pytest.raises(Refused, match="matches no entry"):
        signal_hook.send(c.pid, c.create_time, signal.SIGUSR1, rules)
    assert c.received(timeout=0.3) == []


def test_allow_list_by_name_and_user(child):
    c = child()
    proc = psutil.Process(c.pid)
    rule = AllowRule(name=proc.name()[:3] + "*", user=proc.username())
    signal_hook.send(c.pid, c.create_time, signal.SIGUSR1, [AllowRule(name="nope"), rule])
    assert c.received() == ["SIGUSR1"]


def test_dry_run_checks_but_does_not_send(child):
    c = child()
    detail = signal_hook.send(c.pid, c.create_time, signal.SIGUSR1, ALLOW, dry_run=True)
    assert detail["signal"] == "SIGUSR1"
    assert c.received(timeout=0.3) == []


def test_never_signals_itself_or_init():
    me = psutil.Process(os.getpid())
    with pytest.raises(Refused, match="never signalled"):
        signal_hook.send(os.getpid(), me.create_time(), signal.SIGUSR1, [AllowRule(name="*")])
    with pytest.raises(Refused, match="never signalled"):
        signal_hook.send(1, 0.0, signal.SIGUSR1, [AllowRule(name="*")])
