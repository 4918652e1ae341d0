"""docs/deployment.md's blocks are the real ones: the install block runs as written (its apt
and pip lines run in benchmarks/stock_install.py's fresh Debian root; here the rest, with
`/opt/gpuwatch/bin/gpuwatch` being this checkout), and the check it ends in passes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from gpuwatch import exitcodes
from tests.helpers import REPO, child_env, free_port

DOC = (REPO / "docs" / "deployment.md").read_text()


def section(title: str) -> str:
    return DOC.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def install_block() -> list[str]:
    (block,) = re.findall(r"```sh\n(.*?)```", section("Install"), re.S)
    return [line.split("   #")[0].strip() for line in block.strip().splitlines()]


def test_the_install_block_installs_what_the_readme_installs():
    lines = install_block()
    readme_run = re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)[0]
    assert lines[0] == "apt-get install -y python3-venv" and "python3-venv" in readme_run
    assert lines[1] == "python3 -m venv /opt/gpuwatch && /opt/gpuwatch/bin/pip install ."
    assert "python3 -m venv /opt/gpuwatch && /opt/gpuwatch/bin/pip install -q ." in readme_run


def test_the_install_block_runs_as_written_and_its_check_passes(tmp_path):
    shim = tmp_path / "opt" / "gpuwatch" / "bin" / "gpuwatch"
    shim.parent.mkdir(parents=True)
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuwatch "$@"\n')
    shim.chmod(0o755)
    rest = "\n".join(install_block()[2:])
    script = (rest.replace("/opt/gpuwatch/bin/gpuwatch", str(shim))
              .replace("/etc/gpuwatch", str(tmp_path / "etc" / "gpuwatch")))
    # The listen address moves by the environment, as a user's would: the block stays as is.
    env = child_env(GPUWATCH_LISTEN=f"127.0.0.1:{free_port()}",
                    STATE_DIRECTORY=str(tmp_path / "state"))
    r = subprocess.run(["bash", "-e", "-c", script], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == exitcodes.OK, r.stdout + r.stderr
    assert (tmp_path / "etc/gpuwatch/gpuwatch.toml").read_text() == (
        REPO / "exporters/gpuwatch.toml").read_text()
    statuses = {line.split()[0] for line in r.stdout.splitlines()}
    assert statuses <= {"ok", "warn"} and "Traceback" not in r.stderr, r.stdout
    # every check the page shows is one the command makes, in the page's order
    shown = re.findall(r"^(?:ok|warn|fail)\s+([a-z ]+?)(?: [\w.-]+)?:", section("Checking a host"),
                       re.M)
    made = [re.match(r"^\w+\s+([a-z ]+?)(?: [\w.-]+)?:", line)[1]
            for line in r.stdout.splitlines()]
    assert [n for n in made if n in shown] == [n for n in shown if n in made]
    assert set(shown) - {"engine"} <= set(made), (shown, made)


def test_the_page_shows_the_probe_directory_as_the_daemon_makes_it():
    from gpuwatch.probe_channel.config import SYSTEM_DIR

    assert f"ok   probe directory: {SYSTEM_DIR} (mode 755)" in section("Checking a host")
    assert "1777" not in DOC
    assert Path(SYSTEM_DIR).is_absolute()
