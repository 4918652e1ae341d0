"""The status page at `/`, loaded in headless Chromium from real daemons on loopback, checked
in the rendered DOM as a person would read it.

Screenshots go to the test's directory, and also to $SCREENSHOT_DIR when set (that
is how docs/images/ is refreshed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuwatch.sources.simulate.engine_text import vllm_exposition
from tests.browser import Browser
from tests.helpers import FAST_LEAK_TOML, StaticServer, child_env, free_port, wait_until

pytestmark = pytest.mark.integration

HOSTILE_MODEL = "<img src=x onerror=document.title='owned'>"


def keep_screenshot(browser: Browser, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    browser.screenshot(path)
    assert path.stat().st_size > 10_000  # a real rendering, not a blank page
    if os.environ.get("SCREENSHOT_DIR"):
        shutil.copy(path, Path(os.environ["SCREENSHOT_DIR"]) / name)
    return path


@pytest.fixture
def browser():
    b = Browser()
    yield b
    b.close()


@pytest.fixture
def hostile_engine():
    """A vLLM-like /metrics endpoint whose model label is markup."""
    server = StaticServer(vllm_exposition(3600.0, HOSTILE_MODEL).encode(),
                          "text/plain; version=0.0.4")
    yield server.url + "/metrics"
    server.close()


def rendered(browser: Browser, css: str) -> list[str]:
    return [t for t in browser.text(css) if t.strip()]


def test_mixed_host_page(daemon, browser, tmp_path):
    d = daemon("--simulate", "mixed", config_toml=FAST_LEAK_TOML)
    wait_until(lambda: any(e.get("kv_cache_hit_ratio") is not None
                           for e in d.state()["signals"]["engines"].values()), 30,
               what="a windowed KV hit ratio")
    # one small file, nothing fetched from elsewhere
    code, page = d.get("/")
    assert code == 200 and len(page) < 100_000
    assert not re.search(rb"""(?:src|href)\s*=\s*["']?(?:https?:)?//|@import|url\(""", page)
    browser.get(d.url + "/")
    wait_until(lambda: browser.count(".card.gpu") == 4, 15, what="4 GPU cards")
    # the page's own requests: only api/state on this daemon
    urls = browser.js("return performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(u == d.url + "/api/state" for u in urls), urls
    state = d.state()
    models = [g["name"] for g in state["sample"]["gpus"]]
    assert len(set(models)) == 4
    assert rendered(browser, ".card.gpu .gpu-model") == models
    # one memory bar per GPU, filled in proportion to what is used
    assert browser.count(".card.gpu [data-role=membar]") == 4
    widths = browser.js("return [...document.querySelectorAll('.membar .seg')]"
                        ".map(e => e.getBoundingClientRect().width)")
    # judged + planned segments of every GPU: each is far from empty
    assert all(a + b > 40 for a, b in zip(widths[0::2], widths[1::2], strict=True)), widths
    # the warning and critical lines of the threshold row, on every bar
    assert browser.count(".membar .mark.warning") == 4
    assert browser.count(".membar .mark.critical") == 4
    # each card's zone badge says what the daemon judged
    zones = ["safe", "warning", "critical"]
    badges = browser.text(".card.gpu .gpu-head .badge")
    judged = [zones[state["signals"]["gpus"][g["uuid"]]["zone"]] for g in state["sample"]["gpus"]]
    assert badges == judged
    # the planned vLLM pool is drawn apart from the judged memory
    assert browser.count(".membar .seg.planned[style*='width:0.00%']") == 3

    # the simulated vLLM engine's windowed KV hit ratio, as /api/state has it
    sim = state["signals"]["engines"]["vllm-sim-0"]
    shown = browser.js("return document.querySelector('tr[data-engine=\"vllm-sim-0\"] .kv-hit')"
                       ".textContent")
    assert re.fullmatch(r"\d+ %", shown), shown
    assert abs(int(shown.split()[0]) - 100 * sim["kv_cache_hit_ratio"]) <= 3
    # its serving SLIs, one row per model: TTFT p95, tokens/s, errors as each side saw them
    model = "meta-llama/Llama-3.1-8B-Instruct"
    row = browser.js(f"return document.querySelector('tr.serving[data-model=\"{model}\"]')"
                     ".textContent")
    assert re.search(r"TTFT p95 [\d.]+ m?s · ITL p95 .* · E2E p95 .* · \d+ tok/s · errors "
                     r"client [\d.]+ % · engine [\d.]+ %", " ".join(row.split())), row

    # no layout jumps: the GPU cards stay where they are across refreshes
    def boxes():
        return browser.js("return [...document.querySelectorAll('.card.gpu')].map(c => {"
                          "const r = c.getBoundingClientRect(); return [r.x, r.y, r.width,"
                          " r.height]; })")
    before, stamp = boxes(), browser.js("return document.body.dataset.updated")
    wait_until(lambda: browser.js("return document.body.dataset.updated") != stamp, 10,
               what="a refresh")
    assert boxes() == before
    keep_screenshot(browser, tmp_path, "status-mixed.png")

    # the daemon goes away: the page says so and keeps the last state
    d.stop()
    wait_until(lambda: rendered(browser, ".banner.stale"), 15, what="the stale banner")
    assert "cannot refresh" in rendered(browser, ".banner.stale")[0]
    assert browser.count(".card.gpu") == 4


def test_degraded_and_hostile_engines(daemon, browser, hostile_engine):
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    d = daemon("--simulate", "steady", "--engine", hostile_engine, "--engine", dead,
               config_toml=FAST_LEAK_TOML)
    browser.get(d.url + "/")
    wait_until(lambda: browser.count(".card.gpu") == 2, 15, what="2 GPU cards")

    # a dead engine is down, with its reason, and the degraded source says why
    def dead_row():
        rows = [t for t in rendered(browser, "tr[data-engine]") if "down" in t]
        return rows or None
    row = wait_until(dead_row, 20, what="the dead engine's row")[0]
    assert "refused" in row.lower() or "connect" in row.lower(), row
    banners = rendered(browser, "#banners .banner")
    assert any("is down" in b and dead.split("//")[1].split("/")[0] in b for b in banners)

    # markup from an engine is shown as text, never run
    wait_until(lambda: any(HOSTILE_MODEL in t for t in rendered(browser, "tr[data-engine]")),
               20, what="the hostile engine's row")
    assert browser.count("main img") == 0
    assert browser.js("return document.title") == "gpuwatch"


def test_without_a_driver_the_page_says_why(daemon, browser, tmp_path):
    d = daemon()  # this machine has no NVIDIA driver
    browser.get(d.url + "/")
    banner = wait_until(lambda: rendered(browser, "#banners .banner"), 15, what="a banner")
    assert any(b.startswith("source nvml is down: NVML") for b in banner), banner
    # nothing to attribute is not a failure: one banner, the driver's
    assert len(banner) == 1, banner
    (box,) = rendered(browser, "#gpus")
    assert box.startswith("no GPU sampled yet \u2014 NVML:"), box
    # the box spans the section, its text off the border
    grid, card, text = browser.js(
        "const g = document.getElementById('gpus'), c = g.firstElementChild;"
        "const r = document.createRange(); r.selectNodeContents(c);"
        "return [g.getBoundingClientRect().width, c.getBoundingClientRect(),"
        " r.getBoundingClientRect()]")
    assert card["width"] == pytest.approx(grid, abs=2)
    assert text["left"] - card["left"] >= 10 and text["top"] - card["top"] >= 8
    keep_screenshot(browser, tmp_path, "status-no-gpu.png")


def _state_with_a_critical_gpu(d) -> bytes:
    """The daemon's own state, GPU 0 pushed into its critical zone (what a host hours into a
    leak shows; the simulator takes that long to get there)."""
    state = d.state()
    g = state["sample"]["gpus"][0]
    sig = state["signals"]["gpus"][g["uuid"]]
    g["memory_used_bytes"] = int(0.97 * g["memory_total_bytes"])
    sig["unplanned_memory_bytes"], sig["zone"] = g["memory_used_bytes"], 2
    return json.dumps(state).encode()


def test_critical_zone_keeps_its_marks_and_a_phone_reads_the_page(daemon, tmp_path):
    from gpuwatch.views.page import page_bytes

    d = daemon("--simulate", "mixed", config_toml=FAST_LEAK_TOML)
    wait_until(lambda: len(d.state()["sample"]["gpus"]) == 4, 15, what="4 GPUs")
    server = StaticServer(page_bytes(), "text/html", routes={
        "/api/state": (_state_with_a_critical_gpu(d), "application/json")})
    wide, phone = Browser(), Browser(width=420, height=900)
    try:
        wide.get(server.url + "/")
        wait_until(lambda: wide.count(".card.gpu.z2") == 1, 15, what="a critical GPU")
        # the critical line sits on a red bar: edged in the card's colour, so it shows
        mark, card = wide.js(
            "const m = document.querySelector('.card.gpu.z2 .mark.critical');"
            "const s = getComputedStyle(m);"
            "return [[s.borderLeftColor, s.borderRightColor, s.backgroundColor, s.width],"
            " getComputedStyle(m.closest('.card')).backgroundColor]")
        assert mark[0] == mark[1] == card and mark[2] != card and mark[3] == "4px", mark
        legend = wide.text(".card.gpu.z2 .bar-legend")[0]
        assert "MiB" not in legend and legend.count("GiB") >= 4, legend  # one unit
        keep_screenshot(wide, tmp_path, "status-critical.png")

        phone.get(server.url + "/")
        wait_until(lambda: phone.count(".card.gpu") == 4, 15, what="4 GPU cards")
        # nothing wider than the phone: no sideways scrolling of the page, every card inside
        width, rights = phone.js(
            "return [document.documentElement.scrollWidth,"
            " [...document.querySelectorAll('.card')].map(c => c.getBoundingClientRect().right)]")
        assert width <= 420 and max(rights) <= 420, (width, rights)
        # and nothing inside a GPU card scrolls sideways
        overflow = phone.js("return [...document.querySelectorAll('.card.gpu')]"
                            ".map(c => c.scrollWidth - c.clientWidth)")
        assert max(overflow) <= 0, overflow
        # what matters stays in the process table: pid, name, memory, leak rate, time to OOM
        heads = phone.js("return [...document.querySelectorAll('.card.gpu:first-child .procs th')]"
                         ".filter(e => e.getClientRects().length).map(e => e.innerText.trim())")
        assert heads == ["pid", "process", "memory", "leak rate", "time to OOM"], heads
        keep_screenshot(phone, tmp_path, "status-narrow.png")
    finally:
        wide.close()
        phone.close()
        server.close()


def test_state_turned_off_is_said(daemon, browser):
    d = daemon("--simulate", "steady", config_toml="[http]\napi_state = false\n")
    browser.get(d.url + "/")
    banner = wait_until(lambda: rendered(browser, ".banner.stale"), 15, what="a banner")
    assert "HTTP 404" in banner[0] and "api_state = false" in banner[0], banner


def test_leak_page_shows_pid_rate_time_to_oom_and_action(daemon, browser, tmp_path):
    config = tmp_path / "fast.toml"
    config.write_text(FAST_LEAK_TOML)
    recording = tmp_path / "leak.jsonl"
    d = daemon("--simulate", "leak", "--config", str(config), "--record", str(recording))
    browser.get(d.url + "/")
    wait_until(lambda: browser.count(".card.gpu") == 1, 15, what="the GPU card")
    row = "tr.proc[data-pid='41000']"
    assert browser.count(row) == 1

    def detected():
        return browser.count(row + ".leak") == 1
    wait_until(detected, 90, what="the leak on the page")
    cells = rendered(browser, row + " td")
    assert cells[0] == "41000" and cells[1].startswith("leaky-worker")
    # 50 MB/s simulated; the detector's robust slope, in MiB/s
    rate = re.fullmatch(r"([\d.]+) MiB/s", browser.text(row + " .leak-rate")[0])
    assert rate and 40 <= float(rate.group(1)) <= 80, cells
    ttoom = re.fullmatch(r"(\d+) min", browser.text(row + " .ttoom")[0])
    assert ttoom and 1 <= int(ttoom.group(1)) <= 30, cells
    # compare with the daemon's own figure
    proc = next(p for p in d.state()["signals"]["processes"] if p["pid"] == 41000)
    assert proc["time_to_oom_seconds"] / 60 == pytest.approx(int(ttoom.group(1)), abs=2)

    events = rendered(browser, "#active .event")
    assert any("memory_leak" in e and "41000" in e and "critical" in e for e in events), events

    wait_until(lambda: browser.count(".action-row"), 20, what="the action")
    action = rendered(browser, ".action-row")[0]
    assert "snapshot" in action and "pid 41000 (leaky-worker)" in action
    assert re.search(r"\bok\b", action), action
    time.sleep(1)
    keep_screenshot(browser, tmp_path, "status-leak.png")

    # dark mode: the page follows the browser's colour scheme
    dark = Browser(dark=True)
    try:
        dark.get(d.url + "/")
        wait_until(lambda: dark.count(row + ".leak") == 1, 15, what="the leak, in dark mode")
        bg = dark.js("return getComputedStyle(document.body).backgroundColor")
        rgb = [int(x) for x in re.findall(r"\d+", bg)[:3]]
        assert sum(rgb) < 120, bg
        keep_screenshot(dark, tmp_path, "status-leak-dark.png")
    finally:
        dark.close()

    # the report of what this daemon recorded finds the same leak
    d.stop()
    out = tmp_path / "leak.html"
    audit = tmp_path / f"state-{d.port}" / "audit.jsonl"
    res = subprocess.run([sys.executable, "-m", "gpuwatch", "report", str(recording), "-o",
                          str(out), "--config", str(config), "--audit", str(audit)],
                         capture_output=True, text=True, env=child_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    browser.get(out.as_uri())
    leaks = [r for r in rendered(browser, "#findings tr.finding") if "memory_leak" in r]
    assert len(leaks) == 1 and "pid 41000 (leaky-worker)" in leaks[0], leaks
    # what the daemon did, from its audit log, next to what the replayed policy plans
    assert "snapshot: ok (taken)" in leaks[0] and "snapshot: dry_run (planned)" in leaks[0]
    taken = rendered(browser, "#actions tr.action.taken")
    assert taken and all("pid 41000 (leaky-worker)" in t for t in taken), taken
