"""Exposition text -> one normalized Reading, whatever engine wrote it.

Pure (no I/O, no clock): the engine source reads live scrapes with it off the event loop,
and the engine analyzer re-reads recorded text with it in replay. `common` holds the
normalized vocabulary both sides speak.

Each engine module declares PREFIXES (sample-name prefixes it reads), WANTED (the sample
names it uses) and normalize(expo, text) -> Reading.
"""

from __future__ import annotations

from itertools import islice

from gpuwatch.exposition import aliases, llamacpp, sglang, slis, tgi, triton, vllm
from gpuwatch.exposition.common import Reading, note
from gpuwatch.exposition.detect import describe_unrecognized, detect_kind
from gpuwatch.exposition.parse import MAX_KEPT_LINES, help_text, parse, select_lines

MODULES = {
    "vllm": vllm,
    "sglang": sglang,
    "tgi": tgi,
    "llamacpp": llamacpp,
    "triton": triton,
}

__all__ = ["MODULES", "Reading", "compact", "read"]


def _wanted(kind: str) -> frozenset[str]:
    return MODULES[kind].WANTED | slis.wanted(kind)


def compact(text: str, kind: str = "auto", max_series: int = MAX_KEPT_LINES) -> str:
    """Only what read() uses of an exposition: the wanted sample lines and their # HELP.

    The engine source keeps this (not the whole scrape) in the sample, so the live analysis,
    the recording and its replay all read the same text, a third of the size or less. Text that is
    not recognized stays whole, for the reason read() gives.
    """
    original = text
    text, dialect = aliases.canonical(text)
    detected = detect_kind(text)
    kind = detected if kind == "auto" else kind
    module = MODULES.get(kind or "")
    if module is None:
        return text
    wanted = _wanted(kind)
    lines, _ = select_lines(text, module.PREFIXES, wanted, max_series)
    if not lines:
        return text  # read() explains why from the whole text
    helps = [f"# HELP {n} {h}" for n in sorted(wanted) if (h := help_text(text, n))]
    # the families it declares, so that the unread list survives compaction
    kept = aliases.mark(
        "\n".join([*helps, *aliases.type_lines(text, kind), *lines]) + "\n", dialect)
    return kept if len(kept) < len(original) else original  # nothing to drop (NIM)


def read(
    text: str, kind: str = "auto", max_series: int = MAX_KEPT_LINES,
    max_groups: int | None = None,
) -> tuple[Reading | None, str]:
    """(reading, '') for an exposition gpuwatch understands, else (None, why not).

    kind 'auto' recognizes the engine from its metric names; an explicit kind is trusted
    but must find some of its metrics. At most max_series wanted lines are read, and the
    counters of at most max_groups series groups are kept (the first ones in the text).
    """
    text, dialect = aliases.canonical(text)
    detected = detect_kind(text)
    if kind == "auto":
        if detected is None:
            return None, describe_unrecognized(text)
        kind = detected
    module = MODULES[kind]
    expo = parse(text, module.PREFIXES, _wanted(kind), max_series)
    if not any(name != "process_start_time_seconds" for name in expo.samples):
        why = f"no {kind} metrics in the response"
        if detected and detected != kind:
            why += f" (it looks like {detected})"
        elif expo.skipped_lines:
            why += f" ({expo.skipped_lines} malformed line(s))"
        elif detected is None:
            why += f": {describe_unrecognized(text)}"
        return None, why
    reading = module.normalize(expo, text)
    reading.notes.extend(expo.notes)
    slis.add(reading, expo, kind, module.GROUP, getattr(module, "RANKS", ()))
    if dialect:
        reading.generation = dialect  # nim | sglang_
        reading.notes.append(aliases.DIALECT_NOTES[dialect])
    reading.unread_families = aliases.unread(
        aliases.declared(text, kind), slis.read_families(kind, module.WANTED))
    if max_groups is not None and len(reading.counters) > max_groups:
        extra = len(reading.counters) - max_groups
        reading.counters = dict(islice(reading.counters.items(), max_groups))
        reading.groups_left_out = extra
        note(reading, f"{extra} series group(s) beyond max_series_groups ({max_groups}) "
                      "left out of this scrape")
    return reading, ""
