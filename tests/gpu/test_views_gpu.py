"""The three views on real GPUs: `gpuwatch status` and `gpuwatch report` of a daemon on NVML,
and the status page when Chromium is installed (skipped without a GPU)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, child_env

pytestmark = pytest.mark.gpu


def gpuwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True,
                          text=True, env=child_env(), cwd=REPO, timeout=120)


def test_views_of_real_gpus(daemon, tmp_path):
    rec = tmp_path / "rec.jsonl"
    d = daemon("--record", str(rec))
    gpus = d.state()["sample"]["gpus"]
    assert gpus
    res = gpuwatch("status", d.url)
    assert res.returncode == 0, res.stderr
    lines = [line for line in res.stdout.splitlines() if line.startswith("GPU ")]
    assert len(lines) == len(gpus)
    for line, g in zip(lines, gpus, strict=True):
        assert g["name"][:26] in line and re.search(r"\[[#=.WC]+\]", line), line
    if shutil.which("chromium") and shutil.which("chromedriver"):
        from tests.browser import Browser

        b = Browser()
        try:
            b.get(d.url + "/")
            deadline = time.monotonic() + 15
            while b.count(".card.gpu") < len(gpus) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert b.text(".card.gpu .gpu-model") == [g["name"] for g in gpus]
            assert b.count("[data-role=membar]") == len(gpus)
        finally:
            b.close()
    time.sleep(6)
    d.stop()
    out = tmp_path / "report.html"
    res = gpuwatch("report", str(rec), "-o", str(out))
    assert res.returncode == 0, res.stderr
    page = out.read_text()
    for g in gpus:
        assert f"GPU {g['index']} · {g['name']}" in page
    assert page.count("<svg") >= len(gpus)
