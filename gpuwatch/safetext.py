"""Text that users and engines control, made safe where it enters and where it leaves.

- `valid`: where a string enters a sample. The kernel hands out bytes (process names,
  command lines, user names) and Python decodes them with `surrogateescape`, so a name made
  of the bytes ff fe becomes a str that no UTF-8 encoder accepts. Such bytes become the
  visible text `\\xff\\xfe`; every other string passes unchanged.
- `printable`: where text reaches a terminal or a log line. Control characters (C0, DEL,
  C1) and the invisible bidirectional overrides become escapes (`\\x1b`, `\\r`, `\\u202e`),
  so a process name can neither drive the terminal nor forge a log line.

Both are idempotent, and cost one `isascii()`/`isprintable()` call on ordinary text.
"""

from __future__ import annotations

import re
from typing import Any

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                      "\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def valid(s: str) -> str:
    """s as valid text: undecodable bytes (surrogate escapes) written as \\xNN."""
    if s.isascii():
        return s
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        pass
    try:
        raw = s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no byte stands for
        raw = s.encode("utf-8", "replace")
    return raw.decode("utf-8", "backslashreplace")


def _escape(m: re.Match) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(s: str, keep: str = "") -> str:
    """s for a terminal or a log line: control characters escaped (those in `keep`
    excepted, such as the newlines of a traceback)."""
    s = valid(s)
    if s.isprintable():
        return s
    if keep:
        return "".join(part if part in keep else _CONTROL.sub(_escape, part)
                       for part in re.split(f"([{re.escape(keep)}])", s))
    return _CONTROL.sub(_escape, s)


def _tree(obj: Any, fn) -> Any:
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, dict):
        return {_tree(k, fn): _tree(v, fn) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_tree(v, fn) for v in obj]
    return obj


def valid_tree(obj: Any) -> Any:
    """A copy of plain data (dicts, lists, strings...) with every string `valid`."""
    return _tree(obj, valid)


def printable_tree(obj: Any) -> Any:
    """A copy of plain data with every string `printable`."""
    return _tree(obj, printable)


def encode_json(encoder: Any, obj: Any) -> bytes:
    """encoder.encode(obj) (a msgspec JSON encoder); a string that is not valid text
    somewhere in obj is written `valid` rather than failing the whole document."""
    try:
        return encoder.encode(obj)
    except UnicodeEncodeError:
        import msgspec

        return encoder.encode(valid_tree(msgspec.to_builtins(obj)))
