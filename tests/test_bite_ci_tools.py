"""Tests that need promtool skip on a developer machine without it, but fail where CI=true:
a CI image that lost promtool cannot pass by skipping."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, child_env

TARGET = "tests/test_engine_exporter.py::test_promtool_finds_nothing_to_complain_about"


def run_without_promtool(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    env = child_env()
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    # A PATH with the interpreter only: no promtool on it.
    env["PATH"] = os.path.dirname(sys.executable)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=-ra", TARGET], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("ci", "outcome"), [(None, "1 skipped"), ("true", "1 failed")])
def test_missing_promtool(tmp_path, ci, outcome):
    r = run_without_promtool(tmp_path, ci)
    assert outcome in r.stdout, r.stdout[-2000:]
