"""`gpuwatch status`: in a pseudo-terminal (colour, --watch, Ctrl-C) and in a pipe (plain),
against real daemons on loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pexpect
import pytest

from gpuwatch.views import terminal
from tests.helpers import FAST_LEAK_TOML, REPO, StaticServer, child_env, free_port, wait_until
from tests.test_webconfig import (
    PASSWORD,
    USER,
    pki,  # noqa: F401 - the fixture, shared
    start,
    tls_doc,
    wait_https,
)

pytestmark = pytest.mark.integration
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _interruptible() -> None:
    """In the child before exec: Ctrl-C interrupts it, whatever the harness left ignored (a
    signal ignored in the parent stays ignored across exec, and Python then installs no
    KeyboardInterrupt for it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwatch", "status", *args],
                          capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=60)


def test_watch_in_a_terminal_shows_the_leak_in_colour(daemon):
    d = daemon("--simulate", "leak", config_toml=FAST_LEAK_TOML)
    child = pexpect.spawn(sys.executable, ["-m", "gpuwatch", "status", d.url, "--watch", "1"],
                          env=child_env(TERM="xterm-256color"), cwd=str(REPO),
                          preexec_fn=_interruptible,
                          dimensions=(40, 160), encoding="utf-8", timeout=90)
    try:
        child.expect("NVIDIA A100-SXM4-80GB")
        # refreshed until the leak is detected: the pid with its rate and time to OOM
        child.expect(r"pid 41000 leaky-worker.*?leak (\d+\.\d) MiB/s OOM in (\d+) min")
        rate, minutes = float(child.match.group(1)), int(child.match.group(2))
        assert 40 <= rate <= 80 and 1 <= minutes <= 30
        child.expect("critical memory_leak")
        child.expect(r"snapshot GPU 0 · pid 41000 \(leaky-worker\) → ok")
        screen = child.before
        # colour: the critical lines are bold red, the bar has its zone colours
        child.expect("\x1b\\[1;31m")
        child.expect("\x1b\\[H|\x1b\\[2J")  # the next refresh clears the screen
        assert "Traceback" not in screen
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)


def test_watch_without_rich_redraws_in_place(daemon, tmp_path):
    """rich is optional: without it a terminal gets plain text, redrawn over the last frame
    (cursor home, lines cleared), not a scroll of frames."""
    shadow = tmp_path / "no-rich" / "rich"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('rich is not installed')\n")
    d = daemon("--simulate", "mixed", config_toml=FAST_LEAK_TOML)
    env = child_env(TERM="xterm-256color")
    env["PYTHONPATH"] = os.pathsep.join([str(shadow.parent), env["PYTHONPATH"]])
    child = pexpect.spawn(sys.executable, ["-m", "gpuwatch", "status", d.url, "--watch", "1"],
                          env=env, cwd=str(REPO), preexec_fn=_interruptible,
                          dimensions=(40, 160), encoding="utf-8",
                          timeout=60)
    try:
        child.expect("\x1b\\[2J\x1b\\[H")  # the first frame clears the screen
        child.expect("NVIDIA A100-SXM4-80GB")
        child.expect("\x1b\\[J")
        first = child.before
        child.expect("\x1b\\[H")  # the next frame starts at the top again
        child.expect("\x1b\\[J")
        second = child.before
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
    assert "\x1b[2J" not in second and "NVIDIA A100-SXM4-80GB" in second
    plain = ANSI.sub("", first + second)
    assert "Traceback" not in plain and "\x1b[1;31m" not in first + second  # no colour
    assert re.search(r"pid +40000 python3 .*CPU \d+ % RSS [\d.]+ (GiB|MiB)", plain), plain


def test_plain_in_a_pipe(daemon):
    d = daemon("--simulate", "mixed", config_toml=FAST_LEAK_TOML)
    wait_until(lambda: any(e.get("kv_cache_hit_ratio") is not None
                           for e in d.state()["signals"]["engines"].values()), 30,
               what="a windowed KV hit ratio")
    res = status(d.url)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert not ANSI.search(out)
    state = d.state()
    gpu_lines = [line for line in out.splitlines() if line.startswith("GPU ")]
    assert len(gpu_lines) == 4
    for line, g in zip(gpu_lines, state["sample"]["gpus"], strict=True):
        assert g["name"] in line
        bar = re.search(r"\[([#=.WC]+)\]", line).group(1)
        assert len(bar) == terminal.BAR and "W" in bar and "C" in bar
    # the vLLM pool is drawn as planned memory; each GPU's zone as the daemon judged it
    assert "=" in gpu_lines[1]
    for line, g in zip(gpu_lines, state["sample"]["gpus"], strict=True):
        zone = state["signals"]["gpus"][g["uuid"]]["zone"]
        assert f" {terminal.ZONES[zone]} " in line, line
    hit = re.search(r"vllm-sim-0\s+vllm\s+up\s+.*hit (\d+) %", out)
    ratio = state["signals"]["engines"]["vllm-sim-0"]["kv_cache_hit_ratio"]
    assert hit and abs(int(hit.group(1)) - 100 * ratio) <= 3
    # the serving SLIs under the engine, for its model: p95s, tokens/s, both error ratios
    sli = re.search(r"^\s+meta-llama/Llama-3.1-8B-Instruct: TTFT p95 ([\d.]+ m?s) · ITL "
                    r"p95 [\d.]+ m?s · E2E p95 [\d.]+ m?s · (\d+) tok/s · errors client "
                    r"([\d.]+) % engine ([\d.]+) %$", out, re.M)
    assert sli, out
    eng = state["signals"]["engines"]["vllm-sim-0"]
    assert abs(int(sli.group(2)) - eng["generation_tokens_per_second"]) <= 0.05 * eng[
        "generation_tokens_per_second"] + 1
    active = state["active_events"]
    assert all(e["signal"] in out for e in active) if active else "ACTIVE EVENTS  none" in out


def test_errors_are_one_line():
    res = status(f"http://127.0.0.1:{free_port()}")
    assert res.returncode == 1 and res.stderr.count("\n") == 1
    assert "cannot connect" in res.stderr and "Traceback" not in res.stderr
    for args, word in ((["file:///etc/passwd"], "URL"), (["http://x:1", "--watch", "0"],
                                                         "--watch")):
        res = status(*args)
        assert res.returncode == 2 and word in res.stderr and "Traceback" not in res.stderr


@pytest.fixture
def junk_server():
    server = StaticServer(b"<html>not a daemon</html>", "text/html")
    yield server.url
    server.close()


def test_something_else_answering(junk_server):
    res = status(junk_server)
    assert res.returncode == 1 and "not a gpuwatch state document" in res.stderr


def test_partial_state_shows_dashes():
    s = terminal.summarize({"sample": {"gpus": [{"index": 0, "uuid": "u", "processes": [
        {"pid": 1}]}]}, "signals": {"engines": {"e": {"name": "e", "up": False}}}}, "http://h:1")
    text = terminal.render_plain(s)
    assert "GPU 0" in text and "?" * terminal.BAR in text and "down: ?" in text
    assert terminal.render_plain(terminal.summarize({}, "http://h:1")).startswith("gpuwatch —")
    # the pod a process belongs to, where attribution knows it
    s = terminal.summarize({"sample": {"gpus": [{"index": 0, "uuid": "u", "processes": [
        {"pid": 7, "name": "vllm", "namespace": "serving", "pod": "llama-7c9f"}]}]}}, "x")
    assert "pid       7 vllm (serving/llama-7c9f)" in terminal.render_plain(s)


def test_bar_proportions():
    row = terminal.GpuRow("0", "x", 1, used=60.0, total=100.0, judged=20.0, warning=50.0,
                          critical=80.0, util="", temp="", power="", leak="", health=[])
    runs = terminal.bar(row, width=10)
    text = "".join(c for c, _ in runs)
    assert text == "##===W..C."  # W replaces the planned cell at 50 %
    assert [k for _, k in runs] == ["judged", "planned", "W", "free", "C", "free"]


def test_tls_and_basic_auth(daemon, pki, tmp_path):  # noqa: F811
    d = start(daemon, pki, tls_doc(pki))
    ca = str(pki["ca"])
    wait_https(d, "--cacert", ca, "-u", f"{USER}:{PASSWORD}")
    pw = tmp_path / "password"
    pw.write_text(PASSWORD + "\n")
    res = status(d.https, "--user", USER, "--password-file", str(pw), "--cacert", ca)
    assert res.returncode == 0, res.stderr
    assert "GPU 0" in res.stdout and "GPU 1" in res.stdout
    # wrong password, no CA, credentials in the URL: one line each, no secret echoed
    pw.write_text("wrong\n")
    res = status(d.https, "--user", USER, "--password-file", str(pw), "--cacert", ca)
    assert res.returncode == 1 and "HTTP 401" in res.stderr
    res = status(d.https, "--user", USER, "--password-file", str(pw))
    assert res.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in res.stderr
    res = status(f"https://{USER}:{PASSWORD}@{d.address}")
    assert res.returncode == 2 and PASSWORD not in res.stderr + res.stdout
    assert res.stderr.count("\n") == 1
    # no URL: the daemon's own configuration says where it answers, and that it is TLS
    pw.write_text(PASSWORD + "\n")
    web = next(a for a in d.proc.args if a.endswith(".yml"))
    cfg = tmp_path / "gpuwatch.toml"
    cfg.write_text(f'listen = ":{d.address.rsplit(":", 1)[1]}"\nweb_config = "{web}"\n')
    res = status("--config", str(cfg), "--user", USER, "--password-file", str(pw),
                 "--cacert", ca)
    assert res.returncode == 0, res.stderr
    assert "GPU 0" in res.stdout


def test_the_configured_listen_address_is_the_default_url(daemon, tmp_path):
    d = daemon("--simulate", "steady")
    cfg = tmp_path / "gpuwatch.toml"
    cfg.write_text(f'listen = "{d.address}"\n')
    res = subprocess.run([sys.executable, "-m", "gpuwatch", "status"], capture_output=True,
                         text=True, env=child_env(GPUWATCH_CONFIG=str(cfg)), cwd=REPO,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "GPU 0" in res.stdout
    cfg.write_text('listen = "nowhere"\n')
    res = status("--config", str(cfg))
    assert res.returncode == 2 and res.stderr.startswith("gpuwatch: --config:")
    assert res.stderr.count("\n") == 1
