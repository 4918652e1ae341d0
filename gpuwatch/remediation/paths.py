"""Where remediation keeps its files by default."""

from __future__ import annotations

import os
from pathlib import Path

from gpuwatch.remediation.config import RemediationConfig


def state_dir() -> Path:
    """Where the audit log and snapshots go by default: systemd's StateDirectory= when the
    unit sets one, /var/lib/gpuwatch for root, else the user's XDG state directory."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    if os.geteuid() == 0:
        return Path("/var/lib/gpuwatch")
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return Path(base) / "gpuwatch"


def audit_path(config: RemediationConfig) -> Path:
    return Path(config.audit.path or state_dir() / "audit.jsonl")


def snapshot_dir(config: RemediationConfig) -> str:
    return config.snapshot.dir or str(state_dir() / "snapshots")
