"""Secrets: every secret-bearing field is masked for display, and free text (log lines,
reasons, hook output) is scrubbed of the configured secrets and of URL credentials."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch import redact
from gpuwatch.config import ConfigError, _convert, load
from tests.helpers import child_env
from tests.secret_plant import config_toml, planted


@pytest.fixture
def plant():
    s = planted()
    cfg = _convert(tomllib.loads(config_toml(s, engine_port=8000, flush_port=8001)), "test")
    return s, cfg


def test_every_planted_secret_is_masked_for_display(plant):
    s, cfg = plant
    shown = redact.config_for_display(cfg)
    text = json.dumps(shown)
    assert [k for k, v in s.items() if v in text] == []
    # What is no secret stays readable: hosts, header names, the rest of argv.
    eng, basic = shown["engines"]
    assert basic["url"] == "http://***@127.0.0.1:8000/metrics"
    assert eng["headers"] == {"X-Api-Key": "***"} and eng["bearer_token"] == "***"
    ex = shown["remediation"]["exec"]
    assert ex["argv"][3:] == ["--token", "***"] and ex["env"] == {"HOOK_TOKEN": "***"}
    assert shown["webhook"]["token"] == "***"
    assert shown["remediation"]["flush"]["endpoints"][0]["url"].startswith("http://***@")
    # The original is untouched.
    assert cfg.webhook.token == s["webhook_token"]


def test_empty_secrets_show_as_unset():
    shown = redact.config_for_display(load(None, environ={}))
    assert shown["webhook"]["token"] == ""


def test_scrub_text_removes_each_secret_and_any_url_credentials(plant):
    s, cfg = plant
    values = redact.secret_values(cfg)
    for name, secret in s.items():
        text = f"failed: {name} said {secret}!"
        assert secret not in redact.scrub_text(text, values), name
    # A URL nobody configured (a discovered engine, a redirect) loses its userinfo too.
    assert redact.scrub_text("GET https://u:p@h:1/x failed", ()) == "GET https://***@h:1/x failed"
    assert redact.scrub_text("mail user@example.com", ()) == "mail user@example.com"
    # The credential after an auth scheme is a secret on its own.
    assert redact.scrub_text(f"key was {s['flush_header']}", values) == "key was ***"


def test_scrub_walks_records(plant):
    s, cfg = plant
    rec = {"reason": f"x {s['exec_env']}", "detail": {"argv": ["a", s["exec_arg"]],
                                                      "n": 3, s["engine_bearer"]: None}}
    out = redact.scrub(rec, redact.secret_values(cfg))
    assert not any(v in json.dumps(out) for v in s.values())
    assert out["detail"]["n"] == 3


def test_short_secrets_are_masked_in_fields_not_scrubbed_from_text():
    cfg = load(None, environ={"GPUWATCH_WEBHOOK_TOKEN": "ab"})
    assert redact.config_for_display(cfg)["webhook"]["token"] == "***"
    assert redact.scrub_text("tab", redact.secret_values(cfg)) == "tab"


def test_log_filter_scrubs_messages_and_tracebacks(plant):
    s, cfg = plant
    redact.remember(cfg)
    stream = io.StringIO()
    logger = logging.getLogger("test-redact")
    logger.propagate = False
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        redact.install_log_filter(logger)
        logger.warning("engine %s failed", f"http://a:{s['engine_password']}@h/")
        try:
            raise RuntimeError(f"hook said {s['exec_env']}")
        except RuntimeError:
            logger.exception("with %s", s["webhook_token"])
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "RuntimeError" in out and "engine" in out
    assert [k for k, v in s.items() if v in out] == []


def test_secret_args_must_index_argv(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[remediation.exec]\nargv = ["a", "b"]\nsecret_args = [2]\n')
    with pytest.raises(ConfigError, match=r"exec.secret_args: \[2\] not an index"):
        load(p, environ={})


def test_config_errors_never_print_url_credentials(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[[engines]]\nname = "e"\nurl = "ftp://user:hunter2secret@h/metrics"\n')
    r = subprocess.run([sys.executable, "-m", "gpuwatch", "run", "--config", str(p)],
                       capture_output=True, text=True, env=child_env(), timeout=60)
    assert r.returncode == 2
    assert "engines[0]: url" in r.stderr and "ftp://***@h/metrics" in r.stderr
    assert "hunter2secret" not in r.stderr + r.stdout
    assert len(r.stderr.strip().splitlines()) == 1


def test_api_state_document_is_scrubbed(plant):
    from gpuwatch.exporter.snapshot import Snapshot, SourceStatus
    from gpuwatch.exporter.state_json import state_document

    s, cfg = plant
    snap = Snapshot(config=cfg, sources={"engine:x": SourceStatus(
        up=False, reason="GET http://u:stateleak9f2@h/metrics: refused")})
    text = json.dumps(state_document(snap))
    assert "stateleak9f2" not in text and "http://***@h/metrics" in text
    assert [k for k, v in s.items() if v in text] == []


def test_remediation_records_are_scrubbed_of_its_own_secrets(tmp_path):
    import asyncio

    from gpuwatch.remediation.audit import read_records
    from gpuwatch.remediation.config import (
        AuditConfig,
        ExecConfig,
        RemediationConfig,
        WebhookConfig,
    )
    from gpuwatch.remediation.remediator import Remediator

    secret = "remediationonly" + tmp_path.name[-6:]
    config = RemediationConfig(exec=ExecConfig(argv=["/bin/true", secret], secret_args=[1]),
                               audit=AuditConfig(path=str(tmp_path / "audit.jsonl")))

    async def go():
        rem = Remediator(config, WebhookConfig(), probe_dir="")
        ev = rem._final("exec", "t", "failed", f"hook printed {secret}", "policy",
                        {"argv": ["/bin/true", secret], "tail": f"x{secret}x"})
        await rem.close()
        return ev
    ev = asyncio.run(go())
    assert secret not in json.dumps([ev.reason, ev.detail])
    assert ev.detail["argv"] == ["/bin/true", "***"]
    audit = tmp_path / "audit.jsonl"
    assert secret not in audit.read_text()
    assert any(r.get("reason") == "hook printed ***" for r in read_records(audit))


USERINFO = "abcXYZ019-._~!$&'()*+,;=:%@"


@given(st.text(USERINFO, min_size=1, max_size=40), st.sampled_from(["", "/metrics", "?q=1"]))
def test_mask_url_hides_any_userinfo(userinfo, rest):
    url = f"https://{userinfo}@gpu-host:8000{rest}"
    assert redact.mask_url(url) == f"https://***@gpu-host:8000{rest}"
    assert redact.mask_url(f"see {url} now") == f"see https://***@gpu-host:8000{rest} now"
    assert redact.strip_userinfo(url) == f"https://gpu-host:8000{rest}"


def test_scrub_json_finds_escaped_secrets_and_keeps_json_valid():
    secret = 'quo"te\\back'
    doc = {"a": f"x{secret}y", "b": "http://h:1", "c": "c@d", "u": "http://u:p@h/"}
    out = json.loads(redact.scrub_json(json.dumps(doc).encode(), [secret]))
    assert out == {"a": "x***y", "b": "http://h:1", "c": "c@d", "u": "http://***@h/"}


@pytest.mark.parametrize("hostile", ["://" * 400_000, "://" + "a" * 1_200_000,
                                     ("http://" + "b" * 1000 + "@") * 1000])
def test_scrubbing_hostile_text_ends(hostile):
    # Engine expositions and error texts are foreign input; what a megabyte of it costs:
    # benchmarks/hostile_input_cost.py.
    out = redact.scrub_text(hostile, ["never-there"])
    assert "never-there" not in out and len(out) <= len(hostile)
