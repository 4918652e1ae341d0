"""Drive a Remediator through one escalation rule against a process that runs the probe."""

from __future__ import annotations

import asyncio

from gpuwatch.events import Event
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.remediation.config import (
    AuditConfig,
    EscalationRule,
    FlushConfig,
    RemediationConfig,
    SnapshotConfig,
    WebhookConfig,
)
from gpuwatch.remediation.remediator import Remediator


def run_probe_actions(tmp_path, probe_dir, snap: Snapshot, uuid: str, pid: int,
                      actions: list[str], timeout: float, history: bool = False) -> list:
    """The action events of a critical leak on (uuid, pid) that runs `actions` at once."""
    config = RemediationConfig(
        cooldown_seconds=0, flush=FlushConfig(enabled=True, probe_timeout_seconds=timeout / 2),
        snapshot=SnapshotConfig(dir=str(tmp_path / "snaps"), history=history,
                                probe_timeout_seconds=timeout / 2),
        audit=AuditConfig(path=str(tmp_path / "audit.jsonl")),
        escalation=[EscalationRule(signal="memory_leak", actions=actions,
                                   escalate_after_seconds=0)],
    )
    event = Event(t=snap.tick.t, signal="memory_leak", state="firing", severity="critical",
                  gpu_uuid=uuid, pid=pid)

    async def go():
        rem = Remediator(config, WebhookConfig(), probe_dir=probe_dir)
        out = await rem.on_events([event], snap)
        assert await rem.wait_idle(timeout)
        await asyncio.sleep(0)
        out += rem.take_done()
        await rem.close()
        return out
    return asyncio.run(go())
