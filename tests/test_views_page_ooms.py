"""The status page's OOMs section and the engines' memory plan, in headless Chromium, from a
real state document: the daemon's pipeline over the recording with OOM records (and the real
vLLM 0.32 capture for an engine), served as /api/state beside the page."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gpuwatch.config import load
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.exporter.state_json import state_document
from gpuwatch.model import EngineSample
from gpuwatch.recording import read_recording
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.views.page import page_bytes
from tests.browser import Browser
from tests.helpers import REPO, StaticServer, wait_until

pytestmark = pytest.mark.integration
# the real capture, with the KV pool sized in bytes by the operator (the capture forced its
# block count instead, and then its kv_cache_memory_bytes is not the pool)
VLLM = (REPO / "tests" / "fixtures" / "engines" / "vllm-0.32.0-cpu-real-load.prom").read_text() \
    .replace('num_gpu_blocks_override="16"', 'num_gpu_blocks_override="None"')


def state_of_the_fixture() -> dict:
    pipeline = Pipeline.from_config(load(None, environ={}))
    _, ticks = read_recording(str(REPO / "tests" / "fixtures" / "traces" / "sim-oom.jsonl.gz"))
    recent, tick = [], None
    for tick in ticks:
        if tick.ooms == [] and 5151 in {p.pid for g in tick.gpus for p in g.processes}:
            tick.engines = [EngineSample(name="vllm-0", kind="vllm", url="http://x/metrics",
                                         exposition=VLLM, t=tick.t, pids=[5151])]
        recent += pipeline.update(tick)
    snap = Snapshot(version=1, tick=tick, derived=pipeline.derived, ready=True,
                    recent_events=tuple(recent[-50:]), active_events=tuple(pipeline.active))
    return state_document(snap)


@pytest.fixture
def served():
    doc = json.dumps(state_of_the_fixture()).encode()
    server = StaticServer(page_bytes(), "text/html; charset=utf-8",
                          routes={"/api/state": (doc, "application/json")})
    yield server.url + "/"
    server.close()


def test_the_page_shows_each_oom_with_its_verdict_and_the_engines_memory_plan(served, tmp_path):
    browser = Browser()
    try:
        browser.get(served)
        wait_until(lambda: browser.count("#ooms tr.oom") == 2, 20, what="the OOM rows")
        predicted = browser.text("#ooms tr.oom .predicted")
        assert predicted == ["yes: memory_leak, 54 s before", "no"]  # newest first
        text = " ".join(browser.text("#ooms tr.oom"))
        assert "pid 4242" in text and "GPU full" in text and "raised, process gone" in text
        assert "fragmentation" in text and "caught by the program" in text
        assert browser.count("#ooms tr.oom.unpredicted") == 1
        mem = browser.text("#engines tr.engine-memory")
        assert len(mem) == 1 and "vllm-0" in mem[0] and "GPU 0" in mem[0]
        assert browser.text("#engines tr.engine-memory .kv-bytes") == ["1024 MiB\n2048 tokens"]
        hidden = browser.text("#engines tr.engine-memory .not-exposed")[0]
        assert hidden == "weights, activations peak, cuda graphs"
        assert "0.92 of total (gpu_memory_utilization)" in mem[0]
        browser.screenshot(tmp_path / "status-ooms.png")
        if os.environ.get("SCREENSHOT_DIR"):
            shutil.copy(tmp_path / "status-ooms.png", os.environ["SCREENSHOT_DIR"])
    finally:
        browser.close()
    assert Path(tmp_path / "status-ooms.png").stat().st_size > 10_000
