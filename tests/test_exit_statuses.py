"""Every file the configuration names is checked by `run` (before serving) and `check` alike:
one line, exit 2, no traceback; bind errors that cannot heal are 2, a busy port 75; as
another user than root, `check` and `run` say the same about the probe directory; the
documented statuses are the code's."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpuwatch import exitcodes
from tests.helpers import REPO, Proc, child_env, free_port, wait_until

NOBODY = 65534


def gpuwatch(*args: str, env: dict | None = None, cwd=None, timeout: float = 90):
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True,
                          text=True, env=env or child_env(), cwd=cwd, timeout=timeout)


def one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def _files(tmp: Path) -> dict[str, tuple[str, str]]:
    """case -> (TOML, words the one line holds)"""
    bad_table = tmp / "table.toml"
    bad_table.write_text('version = "site-1"\n')
    exe = tmp / "not-executable"
    exe.write_text("#!/bin/sh\n")
    return {
        "thresholds missing": (f'[thresholds]\nfile = "{tmp}/none.toml"\n',
                               f"thresholds.file: {tmp}/none.toml: file not found"),
        "thresholds invalid": (f'[thresholds]\nfile = "{bad_table}"\n',
                               "extends: an override names the table version it extends"),
        "web config missing": (f'web_config = "{tmp}/web.yml"\n', f"web config {tmp}/web.yml"),
        "kubernetes token missing": (
            f'[attribution.kubernetes_api]\nenabled = true\ntoken_file = "{tmp}/token"\n',
            f"attribution.kubernetes_api.token_file: {tmp}/token: No such file"),
        "exec program missing": (
            f'[remediation.exec]\nenabled = true\nargv = ["{exe}"]\n',
            f"remediation.exec.argv[0]: '{exe}' is not an executable file"),
    }


CASES = ("thresholds missing", "thresholds invalid", "web config missing",
         "kubernetes token missing", "exec program missing")


@pytest.mark.parametrize("case", CASES)
def test_a_bad_file_the_configuration_names_is_one_line_and_status_2(tmp_path, case):
    toml, words = _files(tmp_path)[case]
    cfg = tmp_path / "gpuwatch.toml"
    cfg.write_text(toml)
    listen = f"127.0.0.1:{free_port()}"
    env = child_env(STATE_DIRECTORY=str(tmp_path / "state"))
    for argv in (["run", "--simulate", "steady"], ["check"]):
        r = gpuwatch(*argv, "--config", str(cfg), "--listen", listen, env=env)
        assert r.returncode == exitcodes.USAGE, (argv, r.stdout, r.stderr)
        line = one_line(r)
        assert line.startswith("gpuwatch: configuration error: ") and words in line, line
    # nothing was served: the port is still free
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(listen.rsplit(":", 1)[1])))


def test_bind_errors_that_cannot_heal_are_2_and_a_busy_port_is_75(tmp_path):
    env = child_env(STATE_DIRECTORY=str(tmp_path / "state"))
    # 192.0.2.1 (TEST-NET-1) is no address of this host: binding it fails here, sends nothing
    for listen in ("192.0.2.1:19999", "no-such-host.invalid:19999"):
        r = gpuwatch("run", "--simulate", "steady", "--listen", listen, env=env)
        assert r.returncode == exitcodes.USAGE, (listen, r.stderr)
        assert f"cannot listen on {listen}" in r.stderr and "Traceback" not in r.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = gpuwatch("run", "--simulate", "steady", "--listen",
                     f"127.0.0.1:{busy.getsockname()[1]}", env=env)
    assert r.returncode == exitcodes.TEMPFAIL and "address already in use" in r.stderr.lower()


# gpuwatch as an ordinary user: every module a root run of the same command imported is
# imported first, as root (the interpreter may live in root's home, which that user cannot
# read), then the uid is dropped and the command runs, `run` serving in this process (its
# exec would start an interpreter that user cannot read).
AS_USER = """
import atexit, importlib, os, sys
mods, uid = sys.argv[1], int(sys.argv[2])
if uid:
    for name in open(mods).read().split():
        try:
            importlib.import_module(name)
        except BaseException:
            pass
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
else:
    atexit.register(lambda: open(mods, "w").write("\\n".join(sorted(sys.modules))))
import gpuwatch.serve
from gpuwatch.cli import main
gpuwatch.serve.IN_PROCESS = True
sys.argv = ["gpuwatch", *sys.argv[3:]]
main()
"""


def as_user(uid: int, mods: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", AS_USER, str(mods), str(uid), *args]


def modules_of(tmp: Path, env: dict, *args: str) -> Path:
    """The modules a root `gpuwatch ARGS` (run, stopped after its first tick) and the same
    `gpuwatch check` import."""
    mods = tmp / "modules"
    d = Proc(as_user(0, mods, *args), tmp, "as-root",
             env={**env, "STATE_DIRECTORY": str(tmp / "root-state")})
    try:
        wait_until(lambda: "serving on" in d.output() or not d.alive(), 90,
                   what="the root run's first tick")
    finally:
        d.stop()
    assert mods.exists(), d.output()[-2000:]
    # and what `check` imports besides (it probes engines over HTTP)
    checked = tmp / "modules-check"
    subprocess.run(as_user(0, checked, "check", *args[1:]), capture_output=True, cwd="/",
                   env={**env, "STATE_DIRECTORY": str(tmp / "root-state")}, timeout=120)
    mods.write_text(mods.read_text() + "\n" + checked.read_text())
    return mods


def _reachable_by_others(path: Path) -> bool:
    """The package's data files (the threshold table, the status page) are read after the
    uid is dropped: the checkout must be readable by any user."""
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents]) and bool(
        os.stat(path / "gpuwatch" / "thresholds").st_mode & 0o004)


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not _reachable_by_others(REPO),
    reason="needs root to become another user, and a checkout any user can read")


@pytest.fixture
def nobody_env():
    """The environment of a user's run: a home of theirs in a directory they can reach
    (pytest's own is root's only)."""
    base = Path(tempfile.mkdtemp(prefix="gpuwatch-user-"))
    base.chmod(0o755)
    home = base / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    yield child_env(STATE_DIRECTORY=str(home / "state"), HOME=str(home),
                    GPUWATCH_DISCOVERY_ENABLED="false", TMPDIR=str(base))
    shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_a_privileged_port_without_the_capability_is_2(tmp_path, nobody_env):
    listen = f"127.0.0.1:{free_port()}"
    mods = modules_of(tmp_path, nobody_env, "run", "--simulate", "steady", "--listen", listen)
    r = subprocess.run(as_user(NOBODY, mods, "run", "--simulate", "steady", "--listen",
                               "127.0.0.1:80"), capture_output=True, text=True,
                       env=nobody_env, cwd="/", timeout=120)
    assert r.returncode == exitcodes.USAGE, r.stderr
    assert "cannot listen on 127.0.0.1:80: " in r.stderr and "Traceback" not in r.stderr


@needs_root
def test_as_another_user_check_and_run_say_the_same_about_the_probe_directory(
        tmp_path, nobody_env):
    probe = Path(nobody_env["TMPDIR"]) / "probe"
    probe.mkdir(mode=0o755)  # root's, as the root daemon makes it
    env = {**nobody_env, "GPUWATCH_PROBE_DIR": str(probe)}
    listen = f"127.0.0.1:{free_port()}"
    mods = modules_of(tmp_path, env, "run", "--listen", listen)
    r = subprocess.run(as_user(NOBODY, mods, "check", "--listen", listen), capture_output=True,
                       text=True, env=env, cwd="/", timeout=120)
    (line,) = [x for x in r.stdout.splitlines() if x.split(":")[0].endswith("probe directory")
               ] or [r.stdout + r.stderr]
    assert line.startswith("warn probe directory: ") and f"uid {NOBODY}" in line, r.stdout
    detail = line.removeprefix("warn probe directory: ").split(" -> fix:")[0]
    # run (NVML, not simulated, so that the probe directory is read) starts, saying the same
    d = Proc(as_user(NOBODY, mods, "run", "--listen", listen), tmp_path, "run", env=env)
    try:
        wait_until(lambda: "probe directory" in d.output() or not d.alive(), 60,
                   what="the probe directory's warning")
        assert d.alive() and f"WARNING gpuwatch: probe directory: {detail}" in d.output()
    finally:
        d.stop()


def test_the_documented_statuses_are_the_codes():
    doc = (REPO / "docs" / "deployment.md").read_text()
    section = doc.split("## Exit statuses", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", section, re.M)}
    code = {v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}
    assert documented == code == {0, 1, 2, 75}
    unit = (REPO / "exporters" / "gpuwatch.service").read_text()
    assert re.search(rf"^RestartPreventExitStatus={exitcodes.USAGE}$", unit, re.M)
    assert "ExecStartPre" not in re.sub(r"#.*", "", unit)
