"""`gpuwatch report`: run as a real process over recordings of simulated hosts, the HTML
opened in headless Chromium and checked as a person would read it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.model import EngineSample, GpuSample, ProcessSample, Tick
from gpuwatch.recording import Recorder
from gpuwatch.views.svg import Envelope
from tests.browser import Browser
from tests.helpers import REPO, child_env
from tests.recordings import T0, simulated_recording

GIB = 1 << 30


def gpuwatch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwatch", *args], capture_output=True,
                          text=True, env=child_env(), cwd=REPO, timeout=timeout)


def report(recording: Path, out: Path, *extra: str) -> str:
    res = gpuwatch("report", str(recording), "-o", str(out), *extra)
    assert res.returncode == 0, res.stderr
    return out.read_text()


def replay_events(recording: Path) -> list[dict]:
    res = gpuwatch("replay", str(recording), "--json")
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def assert_self_contained(page: str) -> None:
    assert "<script" not in page.lower()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page, re.I)
    assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", page, re.I)
    assert "@import" not in page


@pytest.fixture(scope="module")
def leak_recording(tmp_path_factory) -> Path:
    return simulated_recording(tmp_path_factory.mktemp("rec") / "leak.jsonl", "leak", 1800)


@pytest.fixture(scope="module")
def mixed_recording(tmp_path_factory) -> Path:
    return simulated_recording(tmp_path_factory.mktemp("rec") / "mixed.jsonl.gz", "mixed", 3600)


@pytest.fixture(scope="module")
def browser():
    b = Browser()
    yield b
    b.close()


def keep(browser: Browser, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    browser.screenshot(path)
    assert path.stat().st_size > 10_000
    if os.environ.get("SCREENSHOT_DIR"):
        shutil.copy(path, Path(os.environ["SCREENSHOT_DIR"]) / name)


def test_leak_report_reads_as_the_replay(leak_recording, browser, tmp_path):
    out = tmp_path / "leak.html"
    page = report(leak_recording, out)
    assert_self_contained(page)
    # the same analysis as `gpuwatch replay`: every firing event is a finding, at its time
    firing = [e for e in replay_events(leak_recording) if e.get("state") == "firing"]
    first = {}
    for e in firing:
        first.setdefault((e["signal"], e.get("gpu_uuid"), e.get("pid")), e)

    browser.get(out.as_uri())
    rows = browser.js("return [...document.querySelectorAll('#findings tr.finding')].map("
                      "r => [...r.cells].map(c => c.textContent))")
    assert len(rows) == len(first)
    leak = next(r for r in rows if r[2] == "memory_leak")
    ev = first[("memory_leak", "GPU-51500000-sim0-4a1e-9000-000000000000", 41000)]
    assert leak[0].startswith(time_of(ev["t"]))
    assert "pid 41000 (leaky-worker)" in leak[3] and "A100" in leak[3]
    rate = float(re.fullmatch(r"([\d.]+) MiB/s", leak[4]).group(1))
    assert rate == pytest.approx(ev["value"] / (1 << 20), abs=0.05)
    assert leak[5] == f"{ev['threshold'] / (1 << 20):.1f} MiB/s"
    ttoom = int(re.fullmatch(r"(\d+) min", leak[6]).group(1))
    assert 5 <= ttoom <= 30
    assert leak[1] == "critical" and "snapshot: dry_run" in leak[8]
    assert leak[7].startswith("resolved")  # the process OOMs and restarts in the recording
    # time to OOM as it was when the condition fired (not as it ended)
    oom = next(r for r in rows if r[2] == "time_to_oom")
    ev = first[("time_to_oom", "GPU-51500000-sim0-4a1e-9000-000000000000", None)]
    assert oom[4] == f"{ev['value'] / 60:.0f} min" == oom[6]

    # the leaking process's chart: memory, the detector's floor, the fitted trend, onset
    h = browser.js("return [...document.querySelectorAll('h3.series')].map(e => e.dataset.pid)")
    assert h[0] == "41000"  # the process with a finding comes first
    chart = "h3.series[data-pid='41000'] + p + figure"
    legend = browser.text(chart + " figcaption")[0]
    for label in ("memory (NVML)", "retained floor (leak detector)", "fitted trend"):
        assert label in legend
    labels = browser.text(chart + " text.vlab")
    onset = next(t for t in labels if t.startswith("onset"))
    # the leak starts 20 s into the recording: the estimated onset is within a minute of it
    m = re.search(r"(\d\d):(\d\d):(\d\d)Z", onset)
    onset_s = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) - (int(T0) % 86400)
    assert -10 <= onset_s <= 80, onset
    assert any(t.startswith("detected") for t in labels)
    # the action is placed on the GPU's chart and the process's
    assert browser.count("figure .marker") >= 4
    keep(browser, tmp_path, "report-leak.png")


def time_of(t: float) -> str:
    import time

    return time.strftime("%H:%M:%SZ", time.gmtime(t))


@pytest.mark.xfail(strict=True, reason=(
    "known: the slow leak from 30 s in (28.6 MiB/min) is growth that never paused, judged "
    "once past loading_max_seconds and 400 MiB more: flagged within its target (1133 s) but "
    "the onset the report estimates from it is 863 s, not within 240 s of the true one"))
def test_mixed_report_gpus_engine_and_slow_leak(mixed_recording, browser, tmp_path):
    out = tmp_path / "mixed.html"
    page = report(mixed_recording, out)
    assert_self_contained(page)
    assert len(page) < 2_000_000
    browser.get(out.as_uri())
    heads = browser.text("h3[id^=gpu-]")
    for model in ("A100-SXM4-80GB", "H100 80GB HBM3", "L40S", "RTX 4090"):
        assert sum(model in h for h in heads) == 1, heads
    # zone bands on every GPU chart
    assert browser.count("h3[id^=gpu-] + p + figure rect.band.critical") == 4
    # the slow leak (30 MB/min from 30 s in) is found by the trend, with its rate
    rows = browser.js("return [...document.querySelectorAll('#findings tr.finding')].map("
                      "r => [...r.cells].map(c => c.textContent))")
    leak = next(r for r in rows if r[2] == "memory_leak")
    assert "pid 44000 (tokenizer-svc)" in leak[3]
    per_min = float(re.fullmatch(r"([\d.]+) MiB/min", leak[4]).group(1))
    assert 24 <= per_min <= 36  # 0.5 MB/s = 28.6 MiB/min (the shortest rising scale's rise)
    assert re.fullmatch(r"[\d.]+ h", leak[6])
    labels = browser.text("h3.series[data-pid='44000'] + p + figure text.vlab")
    onset = next(t for t in labels if t.startswith("onset"))
    m = re.search(r"(\d\d):(\d\d):(\d\d)Z", onset)
    onset_s = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) - (int(T0) % 86400)
    assert -60 <= onset_s <= 240, onset  # true onset: 30 s
    # the probe's reserved bytes are what the detector judged for this process
    assert "allocator reserved (probe)" in browser.text(
        "h3.series[data-pid='44000'] + p + figure figcaption")[0]
    # the engine: KV usage and hit ratio, queue quantiles, running/waiting
    assert browser.count("h3[id='engine-vllm-sim-0']") == 1
    legends = " ".join(browser.text("h3[id='engine-vllm-sim-0'] ~ figure figcaption"))
    for label in ("KV cache usage", "KV hit ratio", "queue p95", "running", "waiting"):
        assert label in legends
    keep(browser, tmp_path, "report-mixed.png")


def test_hostile_names_are_text(tmp_path):
    rec = Recorder(str(tmp_path / "evil.jsonl"), host="<b>host</b>", interval_s=2)
    name = "<script>alert(1)</script>"
    for k in range(30):
        rec.write(Tick(t=T0 + 2 * k, gpus=[GpuSample(
            index=0, uuid="GPU-x\"><svg onload=alert(1)>", name="<img src=x>",
            memory_total_bytes=80 * GIB, memory_used_bytes=10 * GIB,
            processes=[ProcessSample(pid=7, name=name, used_memory_bytes=9 * GIB,
                                     create_time=T0 - 7200)])],
            engines=[EngineSample(name="e", kind="vllm", url="http://127.0.0.1:1/metrics",
                                  error="<i>refused</i>", t=T0 + 2 * k)]))
    rec.close()
    page = report(tmp_path / "evil.jsonl", tmp_path / "evil.html")
    assert_self_contained(page)
    assert "<img" not in page and "<svg onload" not in page and "<b>host" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_misuse_is_one_line_and_status_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    for args, word in (
        ([str(bad), "-o", str(tmp_path / "x.html")], "recording"),
        ([str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "x.html")], "missing.jsonl"),
        ([str(bad)], "-o"),
    ):
        res = gpuwatch("report", *args)
        assert res.returncode == 2, res
        assert "Traceback" not in res.stderr and word in res.stderr, res.stderr
    rec = simulated_recording(tmp_path / "r.jsonl", "steady", 20)
    res = gpuwatch("report", str(rec), "-o", str(tmp_path / "no" / "such" / "dir.html"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and "-o" in res.stderr


def test_a_recording_cut_short_says_so(tmp_path):
    rec = simulated_recording(tmp_path / "r.jsonl", "steady", 60)
    with open(rec, "ab") as f:
        f.write(b'{"t": 1800000060.0, "gpus": [{"ind')  # a crash mid-write
    page = report(rec, tmp_path / "r.html")
    assert "r.jsonl is truncated" in page


def test_envelope_is_bounded_and_keeps_peaks():
    env = Envelope(0.0, max_points=100)
    for i in range(100_000):
        env.add(i * 2.0, 1.0 if i != 54_321 else 50.0)
    assert len(env) <= 200
    assert env.bounds() == (1.0, 50.0)  # the one spike survives every halving
    runs = env.runs()
    assert len(runs) == 1 and runs[0][0][0] < 10_000 and runs[0][-1][0] > 190_000
    # a gap in the series is a gap in the line
    env = Envelope(0.0, max_points=100)
    for t in [*range(0, 100), *range(500, 600)]:
        env.add(float(t), 1.0)
    assert len(env.runs()) == 2


def _recording_with_late_ticks(path: Path) -> Path:
    """A leak host whose ticks slipped under load (gaps of 9 to 29 s on a 2 s interval),
    then stopped for ten minutes."""
    from gpuwatch.sources.simulate import SimulatedBackend

    backend = SimulatedBackend("leak", seed=0, interval=2.0)
    rec = Recorder(str(path), host="sim-late", interval_s=2.0)
    t = T0
    for k in range(1, 401):
        rec.write(Tick(t=t, gpus=backend.sample(t), engines=backend.engines(t),
                       probes=backend.probes(t)))
        t += 29.0 if k % 40 == 0 else 9.0 if k % 15 == 0 else 2.0
        if k == 200:
            t += 600.0  # stopped: a real gap
    rec.close()
    return path


def test_late_ticks_are_said_shaded_and_do_not_break_the_lines(tmp_path):
    page = report(_recording_with_late_ticks(tmp_path / "late.jsonl"), tmp_path / "late.html")
    note = re.search(r'<p class="card late">(.*?)</p>', page, re.S)
    assert note, "the report does not say that ticks were late"
    late, ticks = map(int, re.match(r"(\d+) of (\d+) samples came late", note[1]).groups())
    assert 30 <= late <= 40 and ticks == 400
    assert "the longest gap 29 s" in note[1] and "stopped 1 time for over 60 s" in note[1]
    assert page.count('<rect class="gap"') >= 2 * late  # on the GPU's chart and the process's
    # the GPU's used-memory line: broken once, by the stop, not by any late tick
    gpu_chart = page.split('<h3 id="gpu-0">')[1].split("<h3")[0]
    used = re.findall(r'<polyline class="ln"[^>]*><title>used \(NVML\)</title>', gpu_chart)
    assert len(used) == 2, len(used)


def test_gpu_lines_read_in_one_unit_and_a_derived_row_is_said_once(mixed_recording, tmp_path):
    page = report(mixed_recording, tmp_path / "mixed.html")
    metas = re.findall(r'<h3 id="gpu-\d+">.*?<p class="meta">(.*?)</p>', page, re.S)
    assert len(metas) == 4
    for meta in metas:
        text = re.sub(r"<[^>]+>", "", meta)
        assert "(derived) (derived)" not in text and "derived (derived)" not in text
        units = set(re.findall(r"\d (GiB|MiB)\b", text))
        assert len(units) == 1, text
    assert sum("thresholds derived from its memory" in m for m in metas) == 2  # H100, L40S
