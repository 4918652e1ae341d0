"""The first hour on a real GPU host (skipped without one): the setup doctor sees the driver
and every GPU, the startup summary names each GPU's threshold row, and --require-gpu is
ready once the GPUs are sampled."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import Daemon, child_env

pytestmark = pytest.mark.gpu


def _gpus() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not installed")
    out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip("no GPU")
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def test_check_sees_the_driver_and_every_gpu(tmp_path):
    names = _gpus()
    r = subprocess.run([sys.executable, "-m", "gpuwatch", "check", "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=120,
                       env=child_env(STATE_DIRECTORY=str(tmp_path / "state")))
    nvml = next(line for line in r.stdout.splitlines() if line.split()[1] == "nvml:")
    assert nvml.startswith("ok ") and f"{len(names)} GPU(s)" in nvml, r.stdout
    assert all(name in nvml for name in names)


def test_require_gpu_is_ready_and_the_summary_names_each_row(tmp_path):
    names = _gpus()
    d = Daemon(tmp_path, "--require-gpu")
    try:
        code, body = d.get("/readyz")
        assert code == 200 and b"degraded nvml" not in body
        summary = [line for line in d.output().splitlines()
                   if re.search(r"gpuwatch: GPU \d+: ", line)]
        assert len(summary) == len(names)
        assert all(("calibrated row" in s or "derived row" in s) and "critical >" in s
                   for s in summary)
    finally:
        d.stop()
