"""The exec hook runs a real argv: event on stdin and in the environment, no shell, no
secrets passed on, killed (with its whole process group) at its timeout."""

from __future__ import annotations

import asyncio
import functools
import json
import sys

import psutil
import pytest

from gpuwatch.remediation.hooks import HookFailed
from gpuwatch.remediation.hooks import exec as exec_hook
from tests.helpers import eventually

PAYLOAD = {"signal": "memory_leak", "severity": "critical", "pid": 4242,
           "gpu_uuid": "GPU-abc", "value": 52428800.0, "event": {"nested": [1, 2]}}

RECORDER = """
import json, os, sys
data = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items()}
json.dump({"stdin": data, "env": env, "argv": sys.argv[1:]}, open(sys.argv[1], "w"))
print("done")
"""


def test_event_on_stdin_and_in_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUWATCH_WEBHOOK_TOKEN", "s3cret")
    monkeypatch.setenv("SOME_DAEMON_SECRET", "x")
    out = tmp_path / "seen.json"
    argv = [sys.executable, "-c", RECORDER, str(out), "$HOME; echo injected"]
    detail = asyncio.run(exec_hook.run(argv, PAYLOAD, timeout=20,
                                       extra_env={"HOOK_SETTING": "on"}))
    assert detail["exit_code"] == 0 and detail["stdout_tail"].strip() == "done"
    seen = json.loads(out.read_text())
    assert seen["stdin"] == PAYLOAD
    env = seen["env"]
    assert env["GPUWATCH_EVENT_SIGNAL"] == "memory_leak"
    assert env["GPUWATCH_EVENT_PID"] == "4242"
    assert env["GPUWATCH_EVENT_VALUE"] == "52428800.0"
    assert "GPUWATCH_EVENT_EVENT" not in env  # nested data goes on stdin only
    assert env["HOOK_SETTING"] == "on"
    # The daemon's secrets stay with the daemon.
    assert "GPUWATCH_WEBHOOK_TOKEN" not in env and "SOME_DAEMON_SECRET" not in env
    # No shell: metacharacters arrive verbatim.
    assert seen["argv"] == [str(out), "$HOME; echo injected"]


def test_nonzero_exit_fails_with_stderr(tmp_path):
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('no luck'); sys.exit(3)"]
    with pytest.raises(HookFailed, match="status 3: no luck"):
        asyncio.run(exec_hook.run(argv, PAYLOAD, timeout=20))


def test_missing_program_fails_cleanly(tmp_path):
    with pytest.raises(HookFailed, match="cannot start"):
        asyncio.run(exec_hook.run([str(tmp_path / "nope")], PAYLOAD, timeout=5))


def test_timeout_kills_the_process_group(tmp_path):
    """The hook and a grandchild it started are both gone after the timeout."""
    pids = tmp_path / "pids"
    script = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{__import__(\"os\").getpid()}} {{g.pid}}')\n"
        "time.sleep(120)\n"
    )
    with pytest.raises(HookFailed, match="timed out after 1s"):
        asyncio.run(exec_hook.run([sys.executable, "-c", script], PAYLOAD, timeout=1))
    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    for pid in map(int, pids.read_text().split()):
        # a killed process takes a moment to be gone
        assert eventually(functools.partial(gone, pid)), f"pid {pid} survived the timeout"


def test_a_hook_that_ignores_stdin_still_works(tmp_path):
    big = {**PAYLOAD, "message": "x" * 300_000}  # more than a pipe buffer
    script = "import os; print(len(os.environ['GPUWATCH_EVENT_MESSAGE']))"
    detail = asyncio.run(exec_hook.run([sys.executable, "-c", script], big, timeout=20))
    assert detail["exit_code"] == 0
    assert detail["stdout_tail"].strip() == str(exec_hook.MAX_ENV_VALUE)
