"""Settings of the in-process probe, shared by the daemon (which reads what probes publish and
sends them requests) and by the probe itself (which reads them from GPUWATCH_PROBE_* variables,
the same names the daemon's configuration loader maps to this section).

Where probes publish, when `dir` is empty:
  * `/run/gpuwatch/probe` when we are root, or when it exists (a root daemon creates it,
    0755, and makes inside it an owner-only directory for each user whose process shows up
    on a GPU);
  * otherwise `<temp dir>/gpuwatch-<uid>/probe`, private to one user: a daemon running as that
    user finds the probes of that user's processes.
Inside it each user has `<uid>/` (mode 0700) holding `<pid>.json` per process.
"""

from __future__ import annotations

import logging
import os
from typing import Annotated

import msgspec

log = logging.getLogger(__name__)

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
Ratio = Annotated[float, msgspec.Meta(gt=0, le=1)]

SYSTEM_DIR = "/run/gpuwatch/probe"
ENV_PREFIX = "GPUWATCH_PROBE_"
# A process writes at most this many OOM records in its life (the probe's own cap,
# oom_max_records, is lower). The record format (gpuwatch.probe_channel.oom) takes it from
# here: the daemon holds the format in memory only once a probe has published.
MAX_SEQ = 256


class ProbeConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Daemon: read probe files. Probe: GPUWATCH_PROBE_ENABLED=1 opts a vLLM process in
    # (vllm.general_plugins); =0 keeps the probe off even where it is imported.
    enabled: bool = True
    dir: str = ""
    # Probe: how often it publishes allocator stats and the snapshot summary.
    interval_seconds: PositiveFloat = 5.0
    # Probe: the share of wall time it may spend; it publishes less often past it.
    max_overhead_ratio: Ratio = 0.001
    # Probe: how often it looks for requests (one directory listing).
    request_poll_seconds: PositiveFloat = 0.25
    # Probe: requests older than this are dropped unanswered (the daemon gave up).
    request_max_age_seconds: PositiveFloat = 60.0
    # Probe: uids besides root and its own whose requests it accepts (they also need
    # write access to its directory).
    request_uids: list[int] = []
    # Probe: >0 turns on torch.cuda.memory._record_memory_history with this many entries
    # once CUDA is up, so snapshots carry the allocation history.
    record_history_max_entries: NonNegInt = 0
    # Probe: when the process runs out of GPU memory, keep what its allocator held
    # (gpuwatch.probe_channel.oom): one record per OOM, at most oom_max_records of them and
    # oom_max_bytes on disk (history pickles included) per process.
    oom_records: bool = True
    oom_max_records: Annotated[int, msgspec.Meta(ge=1, le=MAX_SEQ)] = 16
    oom_max_bytes: NonNegInt = 64 * 1024 * 1024
    # Probe: failed requests this close together are one OOM (cuDNN retries with smaller
    # workspaces); the record is final this long after the last.
    oom_burst_seconds: PositiveFloat = 1.0
    # Probe: where allocation history is being recorded, dump it beside the record, for
    # pytorch.org/memory_viz.
    oom_history: bool = True
    # Daemon: a record older than this (or than 3 of its own intervals) is ignored.
    stale_after_seconds: PositiveFloat = 30.0
    # Daemon (as root): the filesystem of its own each user's directory gets, so that no
    # user can fill another's (gpuwatch.sources.probe_fs); 0 bytes: none.
    user_max_bytes: NonNegInt = 512 * 1024**2
    user_max_files: Annotated[int, msgspec.Meta(ge=16)] = 4096


def is_true(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def is_false(value: str) -> bool:
    return value.strip().lower() in ("0", "false", "no", "off")


def from_environ(environ: dict[str, str] | os._Environ | None = None) -> ProbeConfig:
    """ProbeConfig from GPUWATCH_PROBE_* variables, for the probe inside a host process.

    A bad value is logged with its variable name and that setting keeps its default: the
    probe must never take its host down over configuration.
    """
    environ = os.environ if environ is None else environ
    fields = {f.name: f.type for f in msgspec.structs.fields(ProbeConfig)}
    raw: dict[str, object] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):].lower()
        if key not in fields:
            log.warning("gpuwatch probe: %s: unknown setting, ignored", name)
            continue
        if key == "request_uids":
            raw[key] = [v for v in (p.strip() for p in value.split(",")) if v]
        else:
            raw[key] = value
    good: dict[str, object] = {}
    for key, value in raw.items():
        try:
            msgspec.convert({key: value}, ProbeConfig, strict=False)
        except msgspec.ValidationError as exc:
            log.warning("gpuwatch probe: %s%s: %s, default kept", ENV_PREFIX, key.upper(), exc)
            continue
        good[key] = value
    return msgspec.convert(good, ProbeConfig, strict=False)


def resolve_dir(configured: str = "") -> str:
    """The directory probes publish into (see the module docstring)."""
    if configured:
        return configured
    if os.geteuid() == 0 or os.path.isdir(SYSTEM_DIR):
        return SYSTEM_DIR
    import tempfile  # only an unprivileged run has a per-user directory

    return os.path.join(tempfile.gettempdir(), f"gpuwatch-{os.geteuid()}", "probe")
