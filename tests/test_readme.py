"""The README's commands and configuration example are the real ones."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pytest

from gpuwatch.config import load
from tests.helpers import free_port, require_binary

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def test_ci_runs_the_readme_test_command():
    run, test = blocks("sh")[:2]
    assert "gpuwatch run" in run
    assert test.strip() in (ROOT / ".ci" / "run").read_text()


def test_configuration_example_loads(tmp_path):
    (example,) = blocks("toml")
    path = tmp_path / "gpuwatch.toml"
    path.write_text(example)
    cfg = load(path, environ={})
    assert cfg.engines[0].name == "llama-70b"
    assert cfg.signals.queue.slo_seconds == 2.0
    assert cfg.remediation.escalation[0].actions == ["snapshot", "flush", "signal"]


@pytest.mark.integration
def test_first_look_block_works_when_pasted(tmp_path):
    """The block runs as written, with `gpuwatch` being this checkout and a free port."""
    import subprocess
    import sys

    from tests.helpers import child_env

    require_binary("curl")  # the README's install commands install it
    (block,) = blocks("bash")
    shim = tmp_path / "bin" / "gpuwatch"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m gpuwatch "$@"\n')
    shim.chmod(0o755)
    env = child_env(PATH=f"{shim.parent}:/usr/bin:/bin",
                    STATE_DIRECTORY=str(tmp_path / "state"))
    script = block.replace("19400", str(free_port()))
    # As pasted into a shell (no -e: `| head` may cut json.tool short). Its own session, so a
    # daemon the block leaves behind on failure is stopped with it.
    p = subprocess.Popen(["bash", "-c", script], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=150)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("gpu_memory_zone", "engine_kv_cache_hit_ratio",
                 "process_allocator_fragmentation_ratio"):
        assert f"gpuwatch_{name}{{" in r.stdout, name
    assert '"ready": true' in r.stdout
