"""SIGHUP reloads the configuration; an invalid new file keeps the old one."""

from __future__ import annotations

import signal

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
