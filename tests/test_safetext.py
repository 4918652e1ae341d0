"""gpuwatch.safetext: what users' bytes become where they enter a sample and where they reach
a terminal or a log line."""

from __future__ import annotations

import logging
import os
import re

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch import redact, safetext
from gpuwatch.safetext import printable, valid


def test_undecodable_bytes_become_visible_escapes_and_text_passes_unchanged():
    name = os.fsdecode(b"\xff\xfevllm")
    assert valid(name) == "\\xff\\xfevllm"
    assert valid("héllo wörld") == "héllo wörld"
    assert valid("\ud800x") == "?x"  # a lone surrogate no byte stands for


def test_controls_are_escaped_for_terminals_and_logs():
    assert printable("a\x1b[2J\rb\x7f\x9b\u202e\tc\n") == "a\\x1b[2J\\rb\\x7f\\x9b\\u202e\\tc\\n"
    assert printable("line 1\nline\x1b 2", keep="\n") == "line 1\nline\\x1b 2"
    assert printable("ordinary text, ünïcode, 漢字") == "ordinary text, ünïcode, 漢字"


@given(st.binary(max_size=64), st.text(max_size=32))
def test_any_bytes_give_encodable_printable_text_and_both_are_idempotent(raw, text):
    for s in (os.fsdecode(raw), text):
        v, p = valid(s), printable(s)
        v.encode("utf-8")
        p.encode("utf-8")
        assert valid(v) == v and printable(p) == p
        assert not re.search("[\x00-\x1f\x7f-\x9f\u202a-\u202e]", p)


def test_one_bad_string_never_fails_a_json_document():
    enc = msgspec.json.Encoder()
    doc = {"ok": "fine", "bad": [os.fsdecode(b"\xff")], os.fsdecode(b"\xfe"): 1}
    assert msgspec.json.decode(safetext.encode_json(enc, doc)) == {
        "ok": "fine", "bad": ["\\xff"], "\\xfe": 1}


def test_a_name_cannot_forge_a_log_line_or_drive_the_terminal(tmp_path):
    path = tmp_path / "log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("gpuwatch-test-forge")
    logger.addHandler(handler)
    redact.install_log_filter(logger)
    forged = os.fsdecode(b"x\nERROR root: pwned\x1b[2J\r\xff")
    try:
        logger.warning("process %s leaks", forged)
        try:
            raise ValueError(forged)
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
        handler.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "WARNING process x\\nERROR root: pwned\\x1b[2J\\r\\xff leaks"
    assert not any(line.startswith("ERROR root") for line in lines)
    assert "\x1b" not in path.read_text() and "\r" not in path.read_text()
    assert lines[-1] == "ValueError: x\\nERROR root: pwned\\x1b[2J\\r\\xff"
