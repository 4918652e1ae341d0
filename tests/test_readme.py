"""The README's commands and configuration example are the real ones."""

from __future__ import annotations

import re
from pathlib import Path

from gpuwatch.config import load

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
