"""Configuration: defaults, file, environment, flags; errors name the key and the reason."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuwatch import config
from gpuwatch.config import ConfigError, load


def write(tmp_path, text: str):
    p = tmp_path / "gpuwatch.toml"
    p.write_text(text)
    return p


def test_defaults_need_no_file():
    cfg = load(None, environ={})
    assert cfg.listen == f":{config.DEFAULT_PORT}"
    assert cfg.nvml.fast_interval_seconds == 2.0
    assert cfg.nvml.slow_interval_seconds >= 30


@pytest.mark.parametrize("text, key, reason", [
    ("[nvml]\nfast_interval = 1\n", "nvml.fast_interval", "unknown key"),
    ("bogus = 1\n", "bogus", "unknown key"),
    ("[nvml]\nfast_interval_seconds = -1\n", "nvml.fast_interval_seconds", "> 0"),
    ("[nvml]\nfast_interval_seconds = 'fast'\n", "nvml.fast_interval_seconds", "float"),
    ('listen = "nowhere"\n', "listen", "HOST:PORT"),
    ("[nvml]\nslow_interval_seconds = -5\n", "nvml.slow_interval_seconds", ">= 0"),
])
def test_file_errors_name_key_and_reason(tmp_path, text, key, reason):
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text), environ={})
    msg = str(info.value)
    assert key in msg and reason in msg and "gpuwatch.toml" in msg


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="invalid TOML"):
        load(write(tmp_path, "[nvml\n"), environ={})
    with pytest.raises(ConfigError, match="file not found"):
        load(tmp_path / "absent.toml", environ={})


def test_precedence_file_env_flags(tmp_path):
    p = write(tmp_path, 'listen = "127.0.0.1:1"\n[nvml]\nfast_interval_seconds = 5\n'
              "slow_interval_seconds = 60\n")
    env = {"GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "3", "GPUWATCH_LISTEN": "127.0.0.1:2"}
    cfg = load(p, environ=env, overrides={"listen": "127.0.0.1:3", "record": None})
    assert cfg.nvml.fast_interval_seconds == 3.0  # env over file
    assert cfg.nvml.slow_interval_seconds == 60  # file over default
    assert cfg.listen == "127.0.0.1:3"  # flag over env


def test_env_names_nested_keys_with_underscores():
    cfg = load(None, environ={"GPUWATCH_NVML_RETRY_MAX_SECONDS": "7",
                              "GPUWATCH_WEBHOOK_TOKEN": "s3cret"})
    assert cfg.nvml.retry_max_seconds == 7
    assert cfg.webhook.token == "s3cret"
    assert config.to_dict(cfg)["webhook"]["token"] == "***"


def test_unknown_env_variable_is_an_error():
    with pytest.raises(ConfigError, match="GPUWATCH_NVML_FAST: unknown setting"):
        load(None, environ={"GPUWATCH_NVML_FAST": "1"})


def test_the_test_suites_own_variables_are_not_settings():
    # the README has developers export GPUWATCH_TEST_CACHE; gpuwatch run must still start
    cfg = load(None, environ={"GPUWATCH_TEST_CACHE": "/tmp/cache", "GPUWATCH_EVENT_ID": "1"})
    assert cfg == load(None, environ={})


def test_config_file_from_env(tmp_path):
    p = write(tmp_path, "[nvml]\nfast_interval_seconds = 4\n")
    assert load(None, environ={"GPUWATCH_CONFIG": str(p)}).nvml.fast_interval_seconds == 4


@pytest.mark.parametrize("value, expected", [
    (":9", ("", 9)), ("127.0.0.1:19400", ("127.0.0.1", 19400)), ("[::1]:80", ("::1", 80)),
])
def test_parse_listen(value, expected):
    assert config.parse_listen(value) == expected


def test_daemon_exits_2_before_serving_on_bad_config(tmp_path):
    p = write(tmp_path, "[nvml]\nfast_interval_seconds = 0\n")
    r = subprocess.run([sys.executable, "-m", "gpuwatch", "run", "--config", str(p),
                        "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "nvml.fast_interval_seconds" in r.stderr and "serving" not in r.stderr


@pytest.mark.parametrize("name", [
    "GPUWATCH_SERVICE_HOST", "GPUWATCH_PORT_19400_TCP_ADDR", "GPUWATCH_PROBE_SERVICE_PORT",
    "GPUWATCH_TESTS_REQUIRE_ENGINES",
])
def test_other_tools_variables_are_ignored_not_fatal(name):
    # kubelet injects service links for a Service named gpuwatch-*; a harness has its own.
    assert load(None, environ={name: "10.0.0.1"}).listen == load(None, environ={}).listen
