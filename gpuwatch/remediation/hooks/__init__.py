"""The hooks: each acts on one target and returns a detail dict, or raises.

Refused: the action must not run (identity, allow-list, lost GPU); HookFailed: it ran or
tried to and did not succeed.
"""

from __future__ import annotations

from dataclasses import dataclass


class Refused(Exception):
    """The target may not be acted on; nothing was done."""


class HookFailed(Exception):
    """The action was attempted and failed; detail holds what it did get done."""

    def __init__(self, reason: str, detail: dict | None = None) -> None:
        super().__init__(reason)
        self.detail = detail or {}


@dataclass(frozen=True)
class Target:
    """What an action acts on: a process on a GPU, a whole GPU, or an engine."""

    kind: str  # process | gpu | engine
    gpu_uuid: str | None = None
    gpu_index: int | None = None
    pid: int | None = None
    create_time: float | None = None
    process_name: str = ""
    engine: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "engine":
            return f"engine:{self.engine}"
        if self.pid is not None:
            return f"{self.gpu_uuid or 'gpu:?'}/pid:{self.pid}"
        return str(self.gpu_uuid)
