"""The /api/state document: latest sample, conclusions, source health, events."""

from __future__ import annotations

from typing import Any

import msgspec

from gpuwatch import __version__
from gpuwatch.events import as_dict
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.redact import config_for_display, scrub_json
from gpuwatch.safetext import encode_json

_encoder = msgspec.json.Encoder()


def state_document(snap: Snapshot) -> dict[str, Any]:
    """The configuration is masked field by field; the whole document is then scrubbed of
    the known secrets and URL userinfo, which source errors and event texts may quote."""
    derived = snap.derived
    doc = {
        "version": __version__,
        "ready": snap.ready,
        "started": snap.started,
        "t": snap.tick.t if snap.tick else None,
        "sources": {k: msgspec.to_builtins(v) for k, v in snap.sources.items()},
        "sample": _sample(snap),
        "signals": {
            "gpus": msgspec.to_builtins(derived.gpus),
            "processes": [
                {"uuid": uuid, "pid": pid, **msgspec.to_builtins(ps)}
                for (uuid, pid), ps in sorted(derived.processes.items())
            ],
            "engines": msgspec.to_builtins(derived.engines),
            "engine_memory": msgspec.to_builtins(derived.engine_memory),
            "ooms": msgspec.to_builtins(derived.recent_ooms),
            "threshold_table": derived.threshold_table,
            # which processes have series of their own, and why (the series budget)
            "budget": None if derived.budget.exported is None else {
                "folded": derived.budget.folded,
                "exported": [{"uuid": uuid, "pid": pid, "reason": why}
                             for (uuid, pid), why in sorted(derived.budget.reasons.items())]},
        },
        "active_events": [as_dict(e) for e in snap.active_events],
        "recent_events": [as_dict(e) for e in snap.recent_events],
        "extras": msgspec.to_builtins(
            {k: v for k, v in snap.extras.items() if k != "remediation"}
        ),
        "config": config_for_display(snap.config) if snap.config is not None else None,
    }
    return msgspec.json.decode(scrub_json(encode_json(_encoder, doc)))


def _sample(snap: Snapshot) -> dict[str, Any] | None:
    if snap.tick is None:
        return None
    sample = msgspec.to_builtins(snap.tick)
    # An engine's exposition can be megabytes: /api/state gives its size, the recording
    # keeps the text.
    for eng in sample.get("engines", ()):
        text = eng.pop("exposition", None)
        if text is not None:
            eng["exposition_chars"] = len(text)
    return sample
