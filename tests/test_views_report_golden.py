"""The report's HTML, byte for byte, for three recordings of simulated hosts (a leak, a
mixed host with an engine, and a leak whose taken actions come from an audit log): a change
to what the report shows is a change to these files, reviewed as such. Regenerate with
UPDATE_GOLDEN=1 after an intended change."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuwatch import __version__
from gpuwatch import config as config_mod
from gpuwatch.views.report import build
from tests.recordings import T0, simulated_recording

GOLDEN = Path(__file__).parent / "fixtures" / "report"


def _audit(path: Path) -> Path:
    records = [{"t": T0 + 200.0, "action": "snapshot", "target": "pid 41000", "result": "ok",
                "reason": "critical memory_leak", "trigger": "memory_leak",
                "detail": {"signal": "memory_leak", "severity": "critical",
                           "gpu_uuid": "GPU-51500000-sim0-4a1e-9000-000000000000",
                           "pid": 41000}},
               {"t": T0 + 199.0, "action": "snapshot", "target": "pid 41000",
                "result": "started"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


CASES = {
    "leak": lambda d: (simulated_recording(d / "leak.jsonl", "leak", 900), {}),
    "mixed": lambda d: (simulated_recording(d / "mixed.jsonl", "mixed", 300), {}),
    "audit": lambda d: (simulated_recording(d / "audit.jsonl", "leak", 400),
                        {"audit": str(_audit(d / "audit.log")), "actions": False}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_html_is_the_golden_file(case, tmp_path):
    recording, kwargs = CASES[case](tmp_path)
    page = build(str(recording), config_mod.load(None, environ={}), **kwargs)
    page = page.replace(f"gpuwatch {__version__}<", "gpuwatch VERSION<")
    golden = GOLDEN / f"{case}.html"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(page, encoding="utf-8")
    assert page == golden.read_text(encoding="utf-8"), (
        f"the report of {case} differs from {golden.name}; if intended, regenerate with "
        "UPDATE_GOLDEN=1")
