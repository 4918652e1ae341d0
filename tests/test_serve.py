"""`gpuwatch run` checks, then execs the daemon's own process (gpuwatch.serve): the same pid,
without the command line in its memory; what run parsed reaches it and no further."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch import exitcodes, serve
from tests.helpers import REPO, child_env, free_port, http_get, wait_until


@pytest.mark.integration
def test_run_becomes_the_daemon_in_the_same_process(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch", "run", "--simulate", "steady", "--listen",
         f"127.0.0.1:{port}", "--log-level", "warning"], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=child_env(STATE_DIRECTORY=str(tmp_path / "state")))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_get(url + "/readyz", 1.0)[0] == 200, 60, what="/readyz")
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert argv[argv.index(b"-m") + 1] == b"gpuwatch.serve"
        # the flags run parsed are the daemon's: the simulated host, at this address
        status, body = http_get(url + "/metrics", 5.0)
        assert status == 200 and b'driver_version="580.00.00-simulated"' in body
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr[-2000:]


def test_the_handover_is_taken_out_of_the_environment(monkeypatch):
    seen = {}

    def fake_serve(config_file, overrides):
        seen.update(config_file=config_file, overrides=overrides,
                    left=serve.SPEC in os.environ)
        return 0

    monkeypatch.setenv(serve.SPEC, '{"config_file": "/etc/g.toml", "overrides": {"seed": 3}}')
    monkeypatch.setattr(serve, "serve", fake_serve)
    with pytest.raises(SystemExit) as exit_:
        serve.main()
    assert exit_.value.code == 0
    assert seen == {"config_file": "/etc/g.toml", "overrides": {"seed": 3}, "left": False}


def test_started_by_hand_it_says_so_in_one_line():
    env = {k: v for k, v in child_env().items() if k != serve.SPEC}
    r = subprocess.run([sys.executable, "-m", "gpuwatch.serve"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == exitcodes.USAGE
    assert r.stderr.strip().splitlines() == [
        "gpuwatch.serve: started by `gpuwatch run`, not by hand"]


def test_a_configuration_broken_after_the_check_is_one_line_and_2(tmp_path, capsys):
    cfg = tmp_path / "gpuwatch.toml"
    cfg.write_text("[nvml]\nfast_interval_seconds = -1\n")
    assert serve.serve(str(cfg), {"simulate": "steady"}) == exitcodes.USAGE
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gpuwatch: configuration error: ") and "fast_interval" in line


def test_from_a_zip_archive_it_serves_in_the_same_interpreter(monkeypatch):
    served = []
    monkeypatch.setattr(serve, "__file__", "/srv/gpuwatch.pyz/gpuwatch/serve.py")
    monkeypatch.setattr(serve, "serve", lambda *a: served.append(a) or 0)
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("exec from a zip archive"))
    with pytest.raises(SystemExit) as exit_:
        serve.start(None, {"seed": 1})
    assert exit_.value.code == 0 and served == [(None, {"seed": 1})]


def test_the_exec_carries_the_interpreter_flags_and_the_handover(monkeypatch):
    called = []
    monkeypatch.setattr(os, "execve", lambda *a: called.append(a) or sys.exit(0))
    with pytest.raises(SystemExit):
        serve.start("/etc/gpuwatch.toml", {"listen": ":9400"})
    (executable, argv, env), = called
    assert executable == sys.executable and argv[-2:] == ["-m", "gpuwatch.serve"]
    assert argv[1:-2] == subprocess._args_from_interpreter_flags()
    assert env[serve.SPEC] == '{"config_file":"/etc/gpuwatch.toml","overrides":{"listen":":9400"}}'
