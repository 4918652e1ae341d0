"""Read an engine's Prometheus text exposition, keeping only the series gpuwatch uses.

Engines expose hundreds of series; normalizing needs a few dozen. Lines are selected by
metric name with plain string searches (C speed) before prometheus_client's parser sees
them, which keeps a 60 KB vLLM scrape well under a millisecond of parsing. `# HELP` /
`# TYPE` lines and `*_created` series are never needed, so they never reach the parser.
Malformed input never raises: a broken line is skipped and counted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

SUFFIXES = ("", "_total", "_bucket", "_count", "_sum")
# Bounds on hostile input: a line this long or a scrape with more kept lines than this (the
# default of an endpoint's max_series) is not a real engine's exposition.
MAX_LINE_CHARS = 64 * 1024
MAX_KEPT_LINES = 20_000

LabelKey = tuple[tuple[str, str], ...]


@dataclass
class Exposition:
    """Samples by metric name, then by label set; a duplicated series keeps its last value."""

    samples: dict[str, dict[LabelKey, float]] = field(default_factory=dict)
    help: dict[str, str] = field(default_factory=dict)
    skipped_lines: int = 0
    notes: list[str] = field(default_factory=list)

    def get(self, name: str) -> dict[LabelKey, float]:
        return self.samples.get(name, {})

    def __contains__(self, name: str) -> bool:
        return name in self.samples


def wanted_names(bases: tuple[str, ...] | list[str]) -> frozenset[str]:
    """Every sample name a family base name can appear under."""
    return frozenset(b + s for b in bases for s in SUFFIXES)


_NAME = re.compile(r"[^{ \t]*")


def _line_name(line: str) -> str:
    return _NAME.match(line).group()  # type: ignore[union-attr]  # always matches


def select_lines(
    text: str, prefixes: tuple[str, ...], wanted: frozenset[str],
    max_lines: int = MAX_KEPT_LINES,
) -> tuple[list[str], int]:
    """Sample lines whose metric name starts with a prefix and is wanted; (lines, dropped).

    At most max_lines are kept: past that, the rest of the text is not read.
    """
    lines: list[str] = []
    dropped = 0
    for prefix in prefixes:
        needle = "\n" + prefix
        if text.startswith(prefix):
            pos = 0
        else:
            pos = text.find(needle)
            if pos >= 0:
                pos += 1
        while pos >= 0:
            end = text.find("\n", pos)
            line = text[pos:] if end < 0 else text[pos:end]
            if line.endswith("\r"):
                line = line[:-1]
            if len(line) > MAX_LINE_CHARS:
                dropped += 1
            elif _line_name(line) in wanted:
                if len(lines) >= max_lines:
                    dropped += 1
                    break  # not a real engine's exposition: stop reading it
                lines.append(line)
            if end < 0:
                break
            pos = text.find(needle, end)
            if pos >= 0:
                pos += 1
    return lines, dropped


def help_text(text: str, name: str) -> str:
    """The `# HELP name ...` text, or '' (read only where units differ between versions)."""
    marker = f"# HELP {name} "
    i = text.find(marker)
    if i < 0:
        return ""
    end = text.find("\n", i)
    return text[i + len(marker) : end if end >= 0 else len(text)].strip()


def _label_key(labels: dict[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


def _add(expo: Exposition, families) -> None:
    for fam in families:
        for s in fam.samples:
            try:
                value = float(s.value)
            except (TypeError, ValueError):
                expo.skipped_lines += 1
                continue
            expo.samples.setdefault(s.name, {})[_label_key(s.labels)] = value


# Series text ("name{labels}") -> (name, label key), parsed once by prometheus_client's
# parser: label sets repeat from scrape to scrape, only values change, and label parsing is
# most of the parser's cost (replay reads one scrape per tick for a day of ticks). Bounded
# in entries and key length: label values are the endpoint's choice, and one that churns
# them must not grow the cache (about 5 MB at most).
_SERIES_CACHE: dict[str, tuple[str, LabelKey]] = {}
_SERIES_CACHE_MAX = 8192
_SERIES_CACHE_KEY_CHARS = 256


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\\n]*)"(?:,|$)')


def _plain_series(series: str) -> tuple[str, LabelKey] | None:
    """`name{a="x",b="y"}` without escapes or spaces, read with two regexes; None for
    anything else (prometheus_client's parser decides). A label set that churns on every
    scrape misses the cache each time: this keeps a miss cheap."""
    brace = series.find("{")
    if brace < 0:
        return (series, ()) if _METRIC_NAME.fullmatch(series) else None
    name, body = series[:brace], series[brace + 1 : -1]
    if not series.endswith("}") or not _METRIC_NAME.fullmatch(name) or "\\" in body:
        return None
    labels: dict[str, str] = {}
    pos, end = 0, len(body)
    while pos < end:
        m = _LABEL_PAIR.match(body, pos)
        if m is None or m.group(1) in labels:
            return None
        labels[m.group(1)] = m.group(2)
        pos = m.end()
    return name, _label_key(labels)


def text_string_to_metric_families(text: str):
    # Imported on first use: only a host with engines parses expositions, and
    # prometheus_client's import costs the daemon megabytes.
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    return parse_text(text)


def _series(series: str) -> tuple[str, LabelKey] | None:
    hit = _SERIES_CACHE.get(series)
    if hit is not None:
        return hit
    hit = _plain_series(series)
    if hit is None:
        try:
            families = list(text_string_to_metric_families(series + " 0\n"))
            (sample,) = [s for f in families for s in f.samples]
        except Exception:
            return None
        hit = (sample.name, _label_key(sample.labels))
    if len(series) > _SERIES_CACHE_KEY_CHARS:
        return hit
    if len(_SERIES_CACHE) >= _SERIES_CACHE_MAX:
        _SERIES_CACHE.clear()  # hostile churn of label values: start over, stay bounded
    _SERIES_CACHE[series] = hit
    return hit


def _add_cached(expo: Exposition, lines: list[str]) -> list[str]:
    """Add the lines whose series text is known or parses alone; return the others."""
    rest: list[str] = []
    for line in lines:
        brace = line.rfind("}")
        if brace >= 0:
            head, tail = line[:brace + 1], line[brace + 1:]
        elif "{" in line:
            rest.append(line)  # an unterminated label set: the parser's verdict
            continue
        else:
            head, _, tail = line.partition(" ")
        tokens = tail.split()
        parsed = _series(head) if tokens and len(tokens) <= 2 else None
        if parsed is None:
            rest.append(line)
            continue
        try:
            value = float(tokens[0])
        except ValueError:
            rest.append(line)
            continue
        name, key = parsed
        expo.samples.setdefault(name, {})[key] = value
    return rest


def parse(text: str, prefixes: tuple[str, ...], wanted: frozenset[str],
          max_lines: int = MAX_KEPT_LINES) -> Exposition:
    """Parse the wanted series of an exposition; never raises on bad input."""
    expo = Exposition()
    lines, dropped = select_lines(text, prefixes, wanted, max_lines)
    if dropped:
        expo.skipped_lines += dropped
        expo.notes.append(f"{dropped} over-long or excess line(s) ignored")
    lines = _add_cached(expo, lines)
    if not lines:
        return expo
    try:
        _add(expo, text_string_to_metric_families("\n".join(lines) + "\n"))
        return expo
    except Exception:
        # One bad line fails the whole parse: redo it line by line and keep the good ones
        # (samples added before the failure are added again, in order: the last one wins).
        pass
    bad = 0
    for line in lines:
        try:
            _add(expo, text_string_to_metric_families(line + "\n"))
        except Exception:
            bad += 1
    if bad:
        expo.skipped_lines += bad
        expo.notes.append(f"{bad} malformed line(s) skipped")
    return expo


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
