"""SIGHUP reloads the configuration; an invalid new file keeps the old one."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def test_sighup_applies_valid_and_rejects_invalid(daemon, tmp_path):
    d = daemon("--simulate", "steady", config_toml="[nvml]\nslow_interval_seconds = 30\n")
    cfg_path = next(tmp_path.glob("gpuwatch-*.toml"))

    def slow_interval():
        return d.state()["config"]["nvml"]["slow_interval_seconds"]

    assert slow_interval() == 30
    cfg_path.write_text("[nvml]\nslow_interval_seconds = 45\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: slow_interval() == 45, 10, what="reloaded value")

    cfg_path.write_text("[nvml]\nslow_interval_seconds = 'often'\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload rejected" in d.output(), 10, what="rejection in the log")
    assert "nvml.slow_interval_seconds" in d.output()
    assert d.alive() and slow_interval() == 45
    assert d.get("/metrics")[0] == 200


def _cfg(slow: int, engines: bool, bad_route: bool) -> str:
    text = f"[nvml]\nslow_interval_seconds = {slow}\n"
    if engines:
        text += '[[engines]]\nname = "vllm-a"\nurl = "http://127.0.0.1:9/metrics"\n'
    if bad_route:
        # Startup refuses this: the route names an action that is not enabled.
        text += '[webhook]\ntoken = "t0ken-for-tests"\n[[webhook.routes]]\nactions = ["signal"]\n'
    return text


def test_reload_applies_all_or_nothing(daemon, tmp_path):
    d = daemon("--simulate", "steady", config_toml=_cfg(30, engines=True, bad_route=False))
    cfg_path = next(tmp_path.glob("gpuwatch-*.toml"))

    def config():
        return d.state()["config"]

    assert [e["name"] for e in config()["engines"]] == ["vllm-a"]
    # Valid for the loader, refused by remediation: nothing of it may be applied, not even
    # the parts that would have been fine on their own (engines dropped, a new interval).
    cfg_path.write_text(_cfg(45, engines=False, bad_route=True))
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload rejected, nothing applied" in d.output(), 10,
               what="rejection in the log")
    assert "'signal' is not enabled" in d.output()
    t_rejected = time.time()
    # The state of a tick that began after the rejection.
    cfg = wait_until(lambda: (s := d.state())["t"] > t_rejected and s["config"], 10,
                     what="a tick after the rejection")
    assert cfg["nvml"]["slow_interval_seconds"] == 30
    assert [e["name"] for e in cfg["engines"]] == ["vllm-a"]
    assert cfg["webhook"]["routes"] == []
    assert "configuration reloaded" not in d.output()

    cfg_path.write_text(_cfg(45, engines=False, bad_route=False))
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: config()["nvml"]["slow_interval_seconds"] == 45, 10, what="reload")
    assert config()["engines"] == []
    assert "configuration reloaded: all of" in d.output()


def test_reload_from_a_fifo_is_refused_without_hanging(daemon, tmp_path):
    d = daemon("--simulate", "steady", config_toml=_cfg(30, engines=False, bad_route=False))
    cfg_path = next(tmp_path.glob("gpuwatch-*.toml"))
    cfg_path.unlink()
    os.mkfifo(cfg_path)  # nobody ever writes to it
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload rejected" in d.output(), 10, what="rejection in the log")
    assert "not a regular file (a FIFO)" in d.output()
    # Serving and sampling went on; a later reload from a regular file works.
    assert d.get("/metrics")[0] == 200
    cfg_path.unlink()
    cfg_path.write_text(_cfg(40, engines=False, bad_route=False))
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: d.state()["config"]["nvml"]["slow_interval_seconds"] == 40, 10,
               what="reload after the FIFO")
