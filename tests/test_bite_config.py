"""Configuration validation a small change must not get past: port range, log level,
duplicate engine names, secrets masked, only regular files read."""

from __future__ import annotations

import os
import re

import pytest

from gpuwatch import config
from gpuwatch.config import ConfigError, load

ENGINE = '[[engines]]\nname = "{name}"\nurl = "http://127.0.0.1:8000/metrics"\n'


def load_text(tmp_path, text: str):
    p = tmp_path / "gpuwatch.toml"
    p.write_text(text)
    return load(p, environ={})


@pytest.mark.parametrize("listen", [":0", ":65535", "127.0.0.1:1", "[::1]:65535"])
def test_ports_in_range(tmp_path, listen):
    assert load_text(tmp_path, f'listen = "{listen}"\n').listen == listen


@pytest.mark.parametrize("listen", [":65536", ":99999", "host:", ":-1", ":123456", "host"])
def test_ports_out_of_range_name_the_key(tmp_path, listen):
    with pytest.raises(ConfigError, match=r"listen: "):
        load_text(tmp_path, f'listen = "{listen}"\n')


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error", "DEBUG", "Info"])
def test_log_levels(tmp_path, level):
    assert load_text(tmp_path, f'log_level = "{level}"\n').log_level == level


@pytest.mark.parametrize("level", ["verbose", "", "critical", "trace"])
def test_unknown_log_level(tmp_path, level):
    with pytest.raises(ConfigError, match="log_level: must be one of"):
        load_text(tmp_path, f'log_level = "{level}"\n')


def test_duplicate_engine_names(tmp_path):
    ok = load_text(tmp_path, ENGINE.format(name="a") + ENGINE.format(name="b"))
    assert [e.name for e in ok.engines] == ["a", "b"]
    with pytest.raises(ConfigError, match=r"duplicate engine name.* a$"):
        load_text(tmp_path, ENGINE.format(name="a") + ENGINE.format(name="b")
                  + ENGINE.format(name="a"))


def test_engine_credentials_are_masked(tmp_path):
    cfg = load_text(tmp_path, ENGINE.format(name="a")
                    + 'bearer_token = "tok-123"\nheaders = { X-Api-Key = "k-456" }\n'
                    + ENGINE.format(name="b"))
    data = config.to_dict(cfg)
    a, b = data["engines"]
    assert a["bearer_token"] == "***" and a["headers"] == {"X-Api-Key": "***"}
    assert b["bearer_token"] == "" and b["headers"] == {}  # nothing to mask: stays empty
    assert a["url"] == "http://127.0.0.1:8000/metrics"  # the rest is shown
    assert "tok-123" not in repr(data) and "k-456" not in repr(data)
    # Masking works on a copy: the daemon still holds the real credentials.
    assert cfg.engines[0].bearer_token == "tok-123"


def test_webhook_token_is_masked_only_when_set(tmp_path):
    assert config.to_dict(load_text(tmp_path, ""))["webhook"]["token"] == ""
    data = config.to_dict(load_text(tmp_path, '[webhook]\ntoken = "w-789"\n'))
    assert data["webhook"]["token"] == "***"


def test_only_regular_files_are_read(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # nobody writes: a blocking read would never return
    with pytest.raises(ConfigError, match="not a regular file"):
        load(fifo, environ={})
    with pytest.raises(ConfigError, match="not a regular file"):
        load(tmp_path, environ={})
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        load(big, environ={})


def test_documented_defaults(tmp_path):
    cfg = load_text(tmp_path, "")
    assert cfg.listen == ":19400" and cfg.log_level == "info"
    n = cfg.nvml
    assert (n.fast_interval_seconds, n.slow_interval_seconds, n.xid_events,
            n.retry_max_seconds, n.gpus) == (2.0, 30.0, True, 60.0, [])
    assert cfg.http.api_state is True
    # README's [http] and docs/security.md ("Connections"): 512 connections, 64 a client,
    # 10 s for the handshake and headers, 30 s to read a response, 75 s idle, 10 failed
    # logins a minute
    h = cfg.http
    assert (h.max_connections, h.max_connections_per_client, h.header_timeout_seconds,
            h.write_timeout_seconds, h.idle_timeout_seconds, h.auth_failures_per_minute) == (
        512, 64, 10.0, 30.0, 75.0, 10.0)
    assert (cfg.record, cfg.events_log, cfg.simulate, cfg.thresholds.file) == ("", "", "", "")


SECTIONS = ["nvml", "thresholds", "http", "probe", "remediation", "webhook", "discovery",
            "signals"]


@pytest.mark.parametrize("section", SECTIONS)
def test_unknown_keys_are_refused_in_every_section(tmp_path, section):
    with pytest.raises(ConfigError, match=rf"{section}\.no_such_key: unknown key"):
        load_text(tmp_path, f"[{section}]\nno_such_key = 1\n")


@pytest.mark.parametrize("listen", ["::9400", "fe80::1"])
def test_an_unbracketed_ipv6_listen_address_is_told_to_use_brackets(tmp_path, listen):
    with pytest.raises(ConfigError, match=r"an IPv6 address goes in brackets"):
        load_text(tmp_path, f'listen = "{listen}"\n')


@pytest.mark.parametrize("listen", ["host:http", "[::1]:http", "[fe80::1%eth0]:http"])
def test_a_port_that_is_not_a_number_is_told_so(tmp_path, listen):
    with pytest.raises(ConfigError, match=rf"port 'http' in '{re.escape(listen)}' is not a"):
        load_text(tmp_path, f'listen = "{listen}"\n')


def test_a_count_of_one_is_accepted_and_zero_is_not(tmp_path):
    cfg = load_text(tmp_path, "[http]\nmax_connections = 1\nmax_connections_per_client = 1\n")
    assert (cfg.http.max_connections, cfg.http.max_connections_per_client) == (1, 1)
    with pytest.raises(ConfigError, match="max_connections_per_client"):
        load_text(tmp_path, "[http]\nmax_connections_per_client = 0\n")
