"""A GPU user names their process with bytes that are not UTF-8 and with terminal controls
(through prctl(PR_SET_NAME), and through the file name of the binary they run), and leaks
GPU memory under that name. The real daemon over a fake GPU that lists these real
processes of another uid must go on serving, judging, recording and replaying, and nothing
it prints or logs may carry the controls raw.

Before gpuwatch.safetext, one such process made /metrics and /api/state answer 500 on every
scrape, killed the status page and `gpuwatch status`, and with --record failed every tick
before the analyzers ran, while /readyz stayed 200."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading

import pytest

from gpuwatch.recording import read_recording
from gpuwatch.safetext import printable, valid
from gpuwatch.views import terminal
from tests import hostile_users as hu
from tests.helpers import FAST_LEAK_TOML, child_env, needs_binary, wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not hu.ROOT, reason="needs root to run processes of other uids")]

MIB = 1 << 20
RAW_CONTROLS = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")  # a newline ends a line, nothing else


class Gpu:
    """The fake GPU's process list; a leaking pid grows by `rate` bytes per second."""

    def __init__(self, path, pids, leaking: int, rate: float) -> None:
        self.path, self.pids, self.leaking, self.rate = path, pids, leaking, rate
        self.stop = threading.Event()
        self.used = {pid: 4 << 30 for pid in pids}
        self.write()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(f"{p} {u}\n" for p, u in self.used.items()))
        tmp.replace(self.path)

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.used[self.leaking] += int(self.rate / 4)
            self.write()


def no_raw_controls(data: bytes, where: str) -> None:
    m = RAW_CONTROLS.search(data)
    assert m is None, f"{where}: raw control byte {m.group()!r} at {m.start()}: " \
        f"{data[max(0, m.start() - 60):m.start() + 20]!r}"


@needs_binary("promtool")
@needs_binary("chromedriver")
def test_bad_process_names_of_another_user_blind_nothing(daemon, procs, probe_dir, tmp_path):
    renamed = procs.renamed(hu.BAD_COMM, hu.ATTACKER)
    binary = procs.binary_named(hu.BAD_FILE, hu.ATTACKER)
    wait_until(lambda: hu.comm(binary.pid) == hu.BAD_FILE[:15], 5, what="the binary's comm")
    assert hu.comm(renamed.pid) == hu.BAD_COMM
    names = {p.pid: valid(os.fsdecode(hu.comm(p.pid))) for p in (renamed, binary)}
    assert names[renamed.pid].startswith("\\xff\\xfe\x1b[2J\r\x7f")

    gpu = Gpu(tmp_path / "gpu-pids", [renamed.pid, binary.pid], renamed.pid, 150 * MIB)
    rec = tmp_path / "rec.jsonl"
    d = daemon("--record", str(rec), module="tests.fake_nvml_daemon",
               config_toml=FAST_LEAK_TOML + f'[probe]\ndir = "{probe_dir}"\n',
               env={"FAKE_NVML_PIDS_FILE": str(gpu.path)})
    try:
        # The leak under the bad name is judged: the analyzers ran on every tick.
        fired = wait_until(lambda: [e for e in d.state()["active_events"]
                                    if e["signal"] == "memory_leak" and e.get("pid")], 60,
                           what="a leak event for the renamed process")
    finally:
        gpu.stop.set()
    assert fired[0]["pid"] == renamed.pid

    status, body = d.get("/metrics")
    assert status == 200
    text = body.decode()  # valid UTF-8, or this raises
    assert 'gpuwatch_gpu_memory_used_bytes{gpu="0"' in text
    for pid, name in names.items():
        esc = name.replace("\\", "\\\\")
        assert f'pid="{pid}",pod="",process="{esc}"' in text, name
    assert "gpuwatch_tick_failures_total 0.0" in text
    checked = subprocess.run(["promtool", "check", "metrics"], input=body,
                             capture_output=True)
    assert checked.returncode == 0, checked.stderr

    status, body = d.get("/api/state")
    assert status == 200
    state = json.loads(body)
    shown = {p["pid"]: p["name"] for p in state["sample"]["gpus"][0]["processes"]}
    assert shown == names
    assert d.get("/readyz") == (200, b"ready\n")
    assert d.get("/")[0] == 200

    # gpuwatch status: each name shown, its controls escaped, nothing raw on the terminal
    out = subprocess.run([sys.executable, "-m", "gpuwatch", "status", d.url],
                         capture_output=True, env=child_env(), timeout=30)
    assert out.returncode == 0, out.stderr
    no_raw_controls(out.stdout, "gpuwatch status")
    assert printable(names[renamed.pid]).encode() in out.stdout
    # the colour renderer: rich emits its own escapes, but none of the name's
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    terminal.render_rich(terminal.summarize(state, d.url), console)
    drawn = console.file.getvalue()
    assert "\\x1b[2J\\r\\x7f" in drawn and "\x1b[2J" not in drawn and "\r" not in drawn

    # the status page, in Chromium: it renders both processes under their names
    from tests.browser import Browser

    browser = Browser()
    try:
        browser.get(d.url + "/")
        cells = {p: f'tr.proc[data-pid="{p}"] td:nth-child(2)' for p in names}
        wait_until(lambda: all(browser.text(c) for c in cells.values()), 20,
                   what="both process rows on the status page")
        assert browser.text(cells[renamed.pid])[0].startswith("\\xff\\xfe")
        assert browser.text(cells[binary.pid])[0].startswith("\\xfe\\xff")
    finally:
        browser.close()

    d.stop()
    log = d.log_path.read_bytes()
    assert b"Traceback" not in log and b" failed" not in log, log[-3000:]
    no_raw_controls(log, "the daemon's log")
    assert printable(names[renamed.pid]).encode() in log  # the leak event's line

    # the recording holds every tick with both processes; its replay judges the same leak
    _, ticks = read_recording(str(rec))
    ticks = list(ticks)
    assert len(ticks) >= 10
    assert {p.name for p in ticks[-1].gpus[0].processes} == set(names.values())
    cfg = tmp_path / "fast-leak.toml"
    cfg.write_text(FAST_LEAK_TOML)
    replay = subprocess.run([sys.executable, "-m", "gpuwatch", "replay", str(rec), "--json",
                             "--no-actions", "--config", str(cfg)], capture_output=True,
                            env=child_env(), timeout=120)
    assert replay.returncode == 0, replay.stderr
    replayed = [json.loads(line) for line in replay.stdout.splitlines()]
    assert any(e.get("signal") == "memory_leak" and e.get("pid") == renamed.pid
               for e in replayed)
    text_replay = subprocess.run([sys.executable, "-m", "gpuwatch", "replay", str(rec),
                                  "--no-actions", "--config", str(cfg)], capture_output=True,
                                 env=child_env(), timeout=120)
    assert printable(names[renamed.pid]).encode() in text_replay.stdout
    no_raw_controls(text_replay.stdout, "gpuwatch replay")


def test_a_failing_tick_shows_in_readiness_and_metrics_and_logs_once_a_minute(
        tmp_path, monkeypatch, caplog):
    """Whatever makes ticks fail: /readyz says so (503), gpuwatch_tick_failures_total counts
    them, and the log gets one traceback and then one line per minute, not one per tick."""
    import asyncio
    import logging

    from gpuwatch import config as config_mod
    from gpuwatch.daemon import Daemon
    from gpuwatch.exporter.app import readiness

    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path))
    cfg = config_mod.load(None, environ={}, overrides={
        "simulate": "steady", "nvml": {"fast_interval_seconds": 0.01,
                                       "slow_interval_seconds": 0}})
    caplog.set_level(logging.INFO, logger="gpuwatch")
    clock = [0.0]

    def errors() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno >= logging.ERROR]

    def broken(tick):
        raise RuntimeError("analyzer bug")

    async def main() -> None:
        d = Daemon(cfg)
        d.tick_health.clock = lambda: clock[0]
        real_update = d.pipeline.update

        async def ticks(n: int) -> None:  # n more ticks (each one publishes a state)
            goal = d._version + n
            task = asyncio.create_task(d._tick_loop())
            while d._version < goal:
                await asyncio.sleep(0.005)
            d._stop.set()
            await task
            d._stop.clear()

        await ticks(2)  # healthy first
        assert readiness(d.snapshot) == (True, "ready\n")
        d.pipeline.update = broken
        await ticks(30)
        failed = d.tick_health.failures_total
        assert failed >= 30
        ok, text = readiness(d.snapshot)
        assert not ok and f"the last {failed} ticks failed" in text and "analyzer bug" in text
        body = d.renderer.render(d.snapshot).decode()
        assert f"gpuwatch_tick_failures_total {float(failed)}" in body
        assert "gpuwatch_gpu_memory_used_bytes{" in body  # the last good sample still served
        assert len(errors()) == 1 and errors()[0].exc_info  # one traceback for all of them
        clock[0] += 61
        await ticks(3)
        assert len(errors()) == 2
        assert f"{failed - 1} more times since the last report" in errors()[1].getMessage()
        d.pipeline.update = real_update
        clock[0] += 61
        await ticks(2)
        assert readiness(d.snapshot) == (True, "ready\n")
        assert any("works again after" in r.getMessage() for r in caplog.records)
        d.sampler.close()

    asyncio.run(main())
