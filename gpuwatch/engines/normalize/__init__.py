"""Exposition text -> one normalized Reading, whatever engine wrote it.

Each engine module declares PREFIXES (sample-name prefixes it reads), WANTED (the sample
names it uses) and normalize(expo, text) -> Reading.
"""

from __future__ import annotations

from itertools import islice

from gpuwatch.engines.detect import describe_unrecognized, detect_kind
from gpuwatch.engines.normalize import llamacpp, sglang, tgi, triton, vllm
from gpuwatch.engines.normalize.common import Reading, note
from gpuwatch.engines.parse import MAX_KEPT_LINES, help_text, parse, select_lines

MODULES = {
    "vllm": vllm,
    "sglang": sglang,
    "tgi": tgi,
    "llamacpp": llamacpp,
    "triton": triton,
}

__all__ = ["MODULES", "Reading", "compact", "read"]


def compact(text: str, kind: str = "auto", max_series: int = MAX_KEPT_LINES) -> str:
    """Only what read() uses of an exposition: the wanted sample lines and their # HELP.

    The engine source keeps this (not the whole scrape) in the sample, so the live analysis,
    the recording and its replay all read the same text, a tenth of the size. Text that is
    not recognized stays whole, for the reason read() gives.
    """
    detected = detect_kind(text)
    kind = detected if kind == "auto" else kind
    module = MODULES.get(kind or "")
    if module is None:
        return text
    lines, _ = select_lines(text, module.PREFIXES, module.WANTED, max_series)
    if not lines:
        return text  # read() explains why from the whole text
    helps = [f"# HELP {n} {h}" for n in sorted(module.WANTED) if (h := help_text(text, n))]
    return "\n".join([*helps, *lines]) + "\n"


def read(
    text: str, kind: str = "auto", max_series: int = MAX_KEPT_LINES,
    max_groups: int | None = None,
) -> tuple[Reading | None, str]:
    """(reading, '') for an exposition gpuwatch understands, else (None, why not).

    kind 'auto' recognizes the engine from its metric names; an explicit kind is trusted
    but must find some of its metrics. At most max_series wanted lines are read, and the
    counters of at most max_groups series groups are kept (the first ones in the text).
    """
    detected = detect_kind(text)
    if kind == "auto":
        if detected is None:
            return None, describe_unrecognized(text)
        kind = detected
    module = MODULES[kind]
    expo = parse(text, module.PREFIXES, module.WANTED, max_series)
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
    if max_groups is not None and len(reading.counters) > max_groups:
        extra = len(reading.counters) - max_groups
        reading.counters = dict(islice(reading.counters.items(), max_groups))
        reading.groups_left_out = extra
        note(reading, f"{extra} series group(s) beyond max_series_groups ({max_groups}) "
                      "left out of this scrape")
    return reading, ""
