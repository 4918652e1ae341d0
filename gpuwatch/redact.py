"""Secrets never leave the daemon.

One list (SECRET_FIELDS) names every secret-bearing field of the configuration. From it come
the masked configuration that /api/state and `gpuwatch config` show, and the set of secret
values that free text is scrubbed of before it leaves: log lines (a filter on the handlers),
action reasons and details, audit records, hook output. URL userinfo is masked in any text,
known or not, so a URL quoted in an error message never carries its credentials.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import msgspec

from gpuwatch.safetext import printable

MASK = "***"
# Shorter values are still masked in their fields, but scrubbing them out of free text would
# mangle unrelated words.
MIN_SCRUB_LEN = 4

# Paths into the configuration's plain data: "[]" is every element of a list, "*" every value
# of a table, "[secret_args]" the elements of the list whose indices the sibling key
# `secret_args` names. "url" fields keep everything but their userinfo.
SECRET_FIELDS: tuple[tuple[str, str], ...] = (
    ("engines[].url", "url"),
    ("engines[].info_url", "url"),
    ("engines[].headers.*", "value"),
    ("engines[].bearer_token", "value"),
    ("remediation.flush.endpoints[].url", "url"),
    ("remediation.flush.endpoints[].headers.*", "value"),
    ("remediation.exec.env.*", "value"),
    ("remediation.exec.argv[secret_args]", "value"),
    ("webhook.token", "value"),
    ("otlp.endpoint", "url"),
    ("otlp.headers.*", "value"),
)

_SEGMENT = re.compile(r"([^.\[]+)(?:\[([a-z_]*)\])?")
# scheme://userinfo@ anywhere in a text: up to the authority's last '@', as urlsplit reads it
# (a raw '@' in a password must not leave its tail behind).
# Quotes, backslashes and angle brackets cannot be in a userinfo: they end it in JSON and prose.
# Anchored on the literal "://", which the regex engine finds fast in a large document.
_URL_USERINFO = re.compile(r"://[^/?#\s\"\\<>]*@")


def mask_url(url: str) -> str:
    """The URL with its userinfo (user and password) replaced by the mask."""
    return _URL_USERINFO.sub(f"://{MASK}@", url)


def strip_userinfo(url: str) -> str:
    """The URL without user:password: what samples, labels and recordings carry."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def _mask(kind: str, value: Any) -> Any:
    if not isinstance(value, str) or not value:
        return value  # an empty secret shows as unset, which is itself worth knowing
    return mask_url(value) if kind == "url" else MASK


def _url_secrets(url: str) -> list[str]:
    netloc = urlsplit(url).netloc if "://" in url else ""
    if "@" not in netloc:
        return []
    userinfo = netloc.rsplit("@", 1)[0]
    user, _, password = userinfo.partition(":")
    return [userinfo, user, password, unquote(user), unquote(password)]


def _value_secrets(value: str) -> list[str]:
    # "Bearer abc": the credential alone may be quoted too.
    return [value, value.split(" ", 1)[-1].strip()]


def _walk(node: Any, segments: list[tuple[str, str | None]], fn: Callable[[Any], Any]) -> None:
    """Replace, in place, each value the path reaches by fn(value)."""
    if not segments or not isinstance(node, dict):
        return
    (key, index), rest = segments[0], segments[1:]
    if key == "*":
        keys = list(node)
    elif key in node:
        keys = [key]
    else:
        return
    for k in keys:
        child = node[k]
        if index is None:
            if rest:
                _walk(child, rest, fn)
            else:
                node[k] = fn(child)
            continue
        if not isinstance(child, list):
            continue
        picked = range(len(child)) if index == "" else _indices(node.get(index), len(child))
        for i in picked:
            if rest:
                _walk(child[i], rest, fn)
            else:
                child[i] = fn(child[i])


def _indices(value: Any, n: int) -> list[int]:
    return [i for i in value if isinstance(i, int) and 0 <= i < n] if isinstance(
        value, list) else []


def _parse(path: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in _SEGMENT.finditer(path)]


_PATHS = [(_parse(path), kind) for path, kind in SECRET_FIELDS]


def _plain(config: Any) -> dict[str, Any]:
    return msgspec.to_builtins(config)  # a fresh copy: masking never touches the original


def config_for_display(config: Any) -> dict[str, Any]:
    """The configuration (a Config or its plain data) as plain data with every secret masked:
    what /api/state and `gpuwatch config` show."""
    data = _plain(config)
    for segments, kind in _PATHS:
        _walk(data, segments, lambda v, kind=kind: _mask(kind, v))
    return data


def secret_values(config: Any) -> frozenset[str]:
    """Every secret string of the configuration, for scrubbing free text."""
    data = _plain(config)
    found: list[str] = []

    def collect(kind: str, value: Any) -> Any:
        if isinstance(value, str) and value:
            found.extend(_url_secrets(value) if kind == "url" else _value_secrets(value))
        return value

    for segments, kind in _PATHS:
        _walk(data, segments, lambda v, kind=kind: collect(kind, v))
    return frozenset(s for s in found if len(s) >= MIN_SCRUB_LEN)


# The secrets of every configuration this process has loaded (a reload keeps the old ones:
# text about the old configuration may still be on its way out).
_known: frozenset[str] = frozenset()
_ordered: tuple[str, ...] = ()


def remember(config: Any) -> None:
    """Add a loaded configuration's secrets to those scrub() removes by default."""
    global _known, _ordered
    _known = _known | secret_values(config)
    _ordered = tuple(sorted(_known, key=len, reverse=True))  # longest first: no partial leftovers


def _secret_order(secrets: Iterable[str] | None) -> tuple[str, ...]:
    if secrets is None:
        return _ordered
    return tuple(sorted((s for s in secrets if len(s) >= MIN_SCRUB_LEN), key=len, reverse=True))


def scrub_text(text: str, secrets: Iterable[str] | None = None) -> str:
    """text with URL userinfo and every secret replaced by the mask (secrets: default, the
    remembered ones)."""
    text = mask_url(text)
    for secret in _secret_order(secrets):
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub(obj: Any, secrets: Iterable[str] | None = None) -> Any:
    """A copy of plain data (dicts, lists, strings, ...) with every string scrubbed: for event
    and audit records. Keys are scrubbed too (a header name is no secret, but a key built from
    a value might be)."""
    order = _secret_order(secrets)
    return _scrub(obj, order)


def _scrub(obj: Any, order: tuple[str, ...]) -> Any:
    if isinstance(obj, str):
        return scrub_text(obj, order)
    if isinstance(obj, dict):
        return {_scrub(k, order): _scrub(v, order) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_scrub(v, order) for v in obj]
    return obj


def scrub_json(data: bytes, secrets: Iterable[str] | None = None) -> bytes:
    """A JSON document scrubbed as one text: much faster than walking a large document
    string by string. Secrets are also looked for in their JSON-escaped form."""
    order = _secret_order(secrets)
    escaped = tuple(_json.encode(s)[1:-1].decode() for s in order)
    text = scrub_text(data.decode(), tuple(dict.fromkeys((*order, *escaped))))
    return text.encode()


_json = msgspec.json.Encoder()


class LogScrubber(logging.Filter):
    """Formats each record's message now, scrubbed, so no handler writes a secret; the
    traceback of an exception is scrubbed the same way. Control characters are escaped
    (a process name cannot forge a line or drive the terminal); a traceback keeps its
    newlines."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let logging report it as it would
            return True
        record.msg, record.args = printable(scrub_text(message)), None
        if record.exc_info and not record.exc_text:
            record.exc_text = _format_exception(record.exc_info)
        if record.exc_text:
            record.exc_text = printable(scrub_text(record.exc_text), keep="\n")
        if record.stack_info:
            record.stack_info = printable(scrub_text(record.stack_info), keep="\n")
        return True


def _format_exception(exc_info) -> str:
    """The traceback as logging writes it, with each exception's own text escaped whole:
    a message with a newline in it cannot start a line of its own."""
    try:
        te = traceback.TracebackException(*exc_info)
    except Exception:  # fall back to logging's own rendering
        return logging.Formatter().formatException(exc_info)
    todo, seen = [te], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(getattr(t, "_str", None), str):
            t._str = printable(t._str)
        todo += [x for x in (t.__cause__, t.__context__, *(getattr(t, "exceptions", None)
                                                           or ())) if x is not None]
    return "".join(te.format()).rstrip("\n")


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """Scrub every record that the logger's handlers (default: the root's) write."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not any(isinstance(f, LogScrubber) for f in handler.filters):
            handler.addFilter(LogScrubber())
