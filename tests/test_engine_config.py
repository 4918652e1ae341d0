"""Engine configuration: bad values are refused with the key and the reason."""

from __future__ import annotations

import pytest

from gpuwatch import config
from gpuwatch.engines.config import DEFAULT_MAX_BODY_BYTES, EngineConfig
from gpuwatch.signals.config import KvCacheSignalConfig, QueueSignalConfig


def load(tmp_path, toml: str):
    path = tmp_path / "gpuwatch.toml"
    path.write_text(toml)
    return config.load(path, environ={})


def test_defaults(tmp_path):
    cfg = load(tmp_path, '[[engines]]\nname = "v"\nurl = "http://127.0.0.1:8000/metrics"\n')
    e = cfg.engines[0]
    assert (e.kind, e.interval_seconds, e.timeout_seconds) == ("auto", 5.0, 2.0)
    assert e.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 16 * 2**20
    assert e.down_after_failures == 2
    kv, q = KvCacheSignalConfig(), QueueSignalConfig()
    assert (kv.window_seconds, kv.floor) == (300.0, 0.0)
    assert (q.window_seconds, q.quantiles, q.slo_quantile, q.slo_seconds) == (
        300.0, [0.5, 0.95, 0.99], 0.95, 5.0)


@pytest.mark.parametrize(("toml", "message"), [
    ('[[engines]]\nname = "a"\nurl = "http://h:1"\nkind = "vlm"',
     "engines[0]: kind: must be one of auto, vllm, sglang, tgi, llamacpp, triton (got 'vlm')"),
    ('[[engines]]\nname = "a"\nurl = "h:1"', "engines[0]: url: 'h:1' must start with http://"),
    ('[[engines]]\nname = "a"\nurl = "http://:1/m"', "engines[0]: url: 'http://:1/m' has no host"),
    ('[[engines]]\nname = "a b"\nurl = "http://h:1"', "engines[0]: name: 'a b' must be"),
    ('[[engines]]\nname = "a"\nurl = "http://h:1"\ntimout_seconds = 3',
     "engines[0].timout_seconds: unknown key"),
    ('[[engines]]\nname = "a"\nurl = "http://h:1"\ntimeout_seconds = 0',
     "engines[0].timeout_seconds"),
    ('[[engines]]\nname = "a"\nurl = "http://h:1"\nheaders = {"X:Y" = "1"}',
     "engines[0]: headers: 'X:Y' is not a valid header name"),
    ('[[engines]]\nname = "a"\nurl = "http://u:p@h:1/m"\nbearer_token = "t"',
     "engines[0]: credentials in the url and bearer_token would both be sent as the "
     "Authorization header: give only one"),
    ('[[engines]]\nname = "a"\nurl = "http://u@h:1/m"\nheaders = {authorization = "x"}',
     "engines[0]: credentials in the url and an Authorization header would both"),
    ('[[engines]]\nname = "a"\nurl = "http://h:1/m"\nbearer_token = "t"\n'
     'headers = {Authorization = "x"}', "engines[0]: bearer_token and an Authorization"),
    ('[discovery]\nkinds = ["vllm", "ollama"]', "discovery: kinds: unknown kind(s) 'ollama'"),
    ('[signals.queue]\nquantiles = [0.5, 1.5]', "signals.queue: quantiles: 1.5 is not"),
    ('[signals.kv_cache]\nfloor = 0.3\ncritical_floor = 0.5',
     "signals.kv_cache: critical_floor: must not be above floor"),
    ('[signals.kv_cache]\nfloor = 1.5', "signals.kv_cache.floor"),
])
def test_errors_name_the_key(tmp_path, toml, message):
    with pytest.raises(config.ConfigError) as exc:
        load(tmp_path, toml)
    assert message in str(exc.value)


def test_engine_config_direct():
    e = EngineConfig(name="[::1]:8000", url="http://[::1]:8000/metrics", kind="tgi")
    assert e.kind == "tgi"
    with pytest.raises(ValueError, match="port 0"):
        EngineConfig(name="x", url="http://h:0/metrics")
