"""Prometheus text format (0.0.4) for our own metric families.

prometheus_client's generate_latest validates and escapes every label *name* on every
sample (UTF-8 name support), which made it most of the cost of a scrape on a large host.
Our label names are fixed and valid, so only values need escaping. The output is byte-for-
byte what generate_latest writes (tests/test_exporter_text.py checks it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gpuwatch.exporter.metric import Metric, float_to_go_string
from gpuwatch.safetext import valid

_TYPES = {"counter": "counter", "gauge": "gauge", "histogram": "histogram",
          "summary": "summary", "info": "gauge", "stateset": "gauge", "unknown": "untyped",
          "gaugehistogram": "histogram"}


# What the format escapes (backslash, quote, newline), and what it does not but readers split
# lines on: a raw CR passes promtool and breaks prometheus_client reading a file or a socket
# (universal newlines), and str.splitlines() also splits on VT, FF, FS-RS, NEL, LS and PS.
_UNSAFE = re.compile(r'[\\"\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]')
_ESCAPES = {"\\": r"\\", '"': r'\"', "\n": r"\n", "\r": r"\\r"}


def _escape_char(m: re.Match) -> str:
    c = m.group()
    if c in _ESCAPES:
        return _ESCAPES[c]
    # Not in the format: written as visible text (an escaped backslash, then x0b), which
    # Prometheus and prometheus_client both read back as that text.
    return f"\\\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\\\u{ord(c):04x}"


def _escape(v: str) -> str:
    v = valid(v)  # once per label set (see below): one bad value never fails the scrape
    return _UNSAFE.sub(_escape_char, v) if _UNSAFE.search(v) else v


def exposition(metrics: Iterable[Metric]) -> bytes:
    out: list[str] = []
    # A process's label set recurs in each of its families: escaped and joined once. Per
    # call, so it is bounded by what one exposition holds.
    seen: dict[tuple, str] = {}
    for m in metrics:
        name = m.name + ("_total" if m.type == "counter" else "_info" if m.type == "info"
                         else "")
        doc = m.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {_TYPES[m.type]}\n")
        for s in m.samples:
            if s.labels:
                key = tuple(s.labels.items())
                labels = seen.get(key)
                if labels is None:
                    labels = seen[key] = ",".join(
                        f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
                out.append(f"{s.name}{{{labels}}} {float_to_go_string(s.value)}\n")
            else:
                out.append(f"{s.name} {float_to_go_string(s.value)}\n")
    return "".join(out).encode()
