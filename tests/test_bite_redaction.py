"""Secrets that only show in another form or at another time: a percent-encoded URL password
that an engine quotes back decoded, to a real daemon; and a hook that started under the old
configuration and prints the old secret after a reload."""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import json
import logging
import sys

import pytest
from msgspec.structs import replace

from gpuwatch import redact
from gpuwatch.config import load
from gpuwatch.remediation.audit import read_records
from gpuwatch.remediation.config import EscalationRule, ExecConfig
from tests.helpers import LoopbackServer, eventually
from tests.test_remediation_remediator import ev, make, snap_of

USER, ENCODED, DECODED = "scraper", "s3cr%40t%2Fpw-77c1", "s3cr@t/pw-77c1"


class EchoingEngine(LoopbackServer):
    """An engine that refuses every scrape, quoting in its reason phrase the user and
    password it was sent (decoded from the Authorization header, as a real one would see
    them)."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                auth = self.headers.get("Authorization", "")
                creds = base64.b64decode(auth.partition(" ")[2] or b"").decode(errors="replace")
                self.send_response(401, f"no entry for {creds}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def test_a_percent_encoded_password_quoted_back_decoded_never_leaves(daemon):
    engine = EchoingEngine()
    try:
        d = daemon("--simulate", "steady", config_toml=f"""
[[engines]]
name = "basic"
url = "http://{USER}:{ENCODED}@127.0.0.1:{engine.port}/metrics"
interval_seconds = 1
""")
        # the daemon got the engine's answer, and says so (with the credentials masked)
        assert eventually(lambda: "HTTP 401 no entry for" in d.output(), timeout=30)
        state = d.get("/api/state")[1].decode()
        log = d.output()
    finally:
        engine.close()
    for text in (state, log):
        assert DECODED not in text and ENCODED not in text
    assert "no entry for ***:***" in log


SLOW_HOOK = ("import os, sys, time\n"
             "open(sys.argv[1] + '.started', 'w').close()\n"
             "while not os.path.exists(sys.argv[1] + '.go'):\n"
             "    time.sleep(0.02)\n"
             "print('my token is', sys.argv[3])\n")


def exec_config(marker, token: str) -> ExecConfig:
    return ExecConfig(enabled=True, argv=[sys.executable, "-c", SLOW_HOOK, str(marker),
                                          "--token", token], secret_args=[5])


def test_a_hook_that_prints_the_old_secret_after_a_reload_is_scrubbed(tmp_path):
    """The secrets of every configuration loaded stay in the scrub list: text about the old
    one (here a hook started before the reload) is still on its way out."""
    old, new = "old-hook-token-5e0d1c", "new-hook-token-93fa2b"
    marker = tmp_path / "hook"
    rule = [EscalationRule(signal="memory_leak", actions=["exec"])]

    async def go():
        rem = make(tmp_path, exec=exec_config(marker, old), escalation=rule)
        out = await rem.on_events([ev()], snap_of())
        while not (tmp_path / "hook.started").exists():
            await asyncio.sleep(0.02)
        rem.reconfigure(replace(rem.config, exec=exec_config(marker, new)), rem.webhook_config)
        (tmp_path / "hook.go").touch()
        assert await rem.wait_idle(30)
        out += rem.take_done()
        await rem.close()
        return out
    out = asyncio.run(go())
    [done] = [a for a in out if a.result == "ok"]
    assert "my token is ***" in done.detail["stdout_tail"]
    audit = (tmp_path / "audit.jsonl").read_text()
    for text in (json.dumps([a.detail for a in out]), audit):
        assert old not in text and new not in text
    assert [r["result"] for r in read_records(tmp_path / "audit.jsonl") if "action" in r] == [
        "started", "ok"]


def loaded(tmp_path, toml: str):
    path = tmp_path / "gpuwatch.toml"
    path.write_text(toml)
    return load(path, environ={})


def test_a_password_with_a_raw_at_sign_is_scrubbed_whole(tmp_path):
    """urlsplit reads the userinfo up to the authority's last '@', and so must the scrub."""
    cfg = loaded(tmp_path, '[[engines]]\nname = "e"\n'
                           'url = "http://scraper:pa@ss-word-4d1e@127.0.0.1:8000/metrics"\n')
    out = redact.scrub_text("the engine said: bad password pa@ss-word-4d1e",
                            redact.secret_values(cfg))
    assert "pa@ss" not in out and "word-4d1e" not in out


def test_a_credential_with_spaces_after_its_scheme_is_scrubbed_whole(tmp_path):
    cfg = loaded(tmp_path, '[[engines]]\nname = "e"\nurl = "http://127.0.0.1:8000/metrics"\n'
                           'headers = { Authorization = "Token part-one-6b2 part-two-c9e" }\n')
    out = redact.scrub_text("rejected 'part-one-6b2 part-two-c9e'", redact.secret_values(cfg))
    assert "part-one" not in out and "part-two" not in out


@pytest.mark.parametrize("secret, scrubbed", [("a1b2", True), ("a1b", False)])
def test_secrets_of_four_characters_and_more_are_scrubbed_from_text(tmp_path, secret, scrubbed):
    """Shorter ones are masked in their fields only: scrubbing them out of free text would
    mangle unrelated words."""
    cfg = loaded(tmp_path, f'[webhook]\ntoken = "{secret}"\n')
    assert redact.config_for_display(cfg)["webhook"]["token"] == "***"
    out = redact.scrub_text(f"token {secret} refused", redact.secret_values(cfg))
    assert (secret not in out) is scrubbed


def test_the_first_argument_can_be_the_secret_one(tmp_path):
    """secret_args indexes argv from 0: a program path that carries a token is masked."""
    cfg = loaded(tmp_path, '[remediation.exec]\nargv = ["/opt/hooks/tok-7f1c2/run", "--x"]\n'
                           'secret_args = [0]\n')
    shown = redact.config_for_display(cfg)["remediation"]["exec"]["argv"]
    assert shown == ["***", "--x"]
    assert "tok-7f1c2" not in redact.scrub_text("ran /opt/hooks/tok-7f1c2/run",
                                                redact.secret_values(cfg))


def test_a_log_call_with_a_bad_format_is_reported_as_logging_would(capsys):
    """The scrubbing filter lets the record through unformatted: logging reports the broken
    call (on stderr) instead of the line vanishing."""
    logger = logging.getLogger("gpuwatch.test.badformat")
    logger.propagate = False  # only this handler: pytest's own would raise instead
    handler = logging.StreamHandler(io.StringIO())
    logger.addHandler(handler)
    redact.install_log_filter(logger)
    try:
        logger.warning("took %d ms", "many")
    finally:
        logger.removeHandler(handler)
    assert "--- Logging error ---" in capsys.readouterr().err


@pytest.mark.parametrize("odd", [None, 42, ["gzip"]])
def test_plain_data_shaped_otherwise_than_the_configuration_is_shown_not_crashed_on(odd):
    """config_for_display takes plain data too: where a secret field's path meets a value
    that is no table (a null, a number, a list where headers are a table), that value is
    left as it is, and every other secret is still masked."""
    data = {"otlp": {"endpoint": "https://u:otlp-pass-5a@collector:4318", "headers": odd},
            "webhook": {"token": "hook-token-4c3b"},
            "engines": [{"url": "http://e:engine-pass-1f@127.0.0.1:8000", "headers": odd}]}
    shown = redact.config_for_display(data)
    assert shown["otlp"]["headers"] == odd and shown["engines"][0]["headers"] == odd
    assert shown["otlp"]["endpoint"] == "https://***@collector:4318"
    assert shown["engines"][0]["url"] == "http://***@127.0.0.1:8000"
    assert shown["webhook"]["token"] == "***"


def test_secret_args_that_name_no_argument_mask_nothing_else():
    """Plain data is not validated as a loaded configuration is: indices past the end of
    argv, negative or not integers pick no argument (none is masked for them, nothing
    fails), the valid one is masked."""
    data = {"remediation": {"exec": {"argv": ["/hook", "s3cret-arg-77", "--verbose"],
                                     "secret_args": [1, 3, -1, "2"]}}}
    shown = redact.config_for_display(data)["remediation"]["exec"]
    assert shown["argv"] == ["/hook", "***", "--verbose"]
    assert redact.secret_values(data) == {"s3cret-arg-77"}
