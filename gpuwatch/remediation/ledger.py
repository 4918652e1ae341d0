"""Accounting for every decision: the counters behind gpuwatch_remediation_actions_total, the
log line, and the audit record. Audit records are queued for the audit log's writer thread,
so accounting never waits for the disk on the event loop.

Reasons and details quote URLs, hook output and commands: final() scrubs them before they go
to the log, the events log, /api/state and the audit log; and every audit record passes
through _record(), the one place where it is scrubbed before it leaves the daemon.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from pathlib import Path
from typing import Any

import msgspec

from gpuwatch import logfmt, redact
from gpuwatch.events import ActionEvent
from gpuwatch.remediation.audit import AuditLog
from gpuwatch.remediation.config import ACTIONS, RemediationConfig
from gpuwatch.remediation.paths import audit_path

log = logging.getLogger("gpuwatch.remediation.remediator")

REJECTED_PER_SECOND = 20
RESULTS = ("ok", "failed", "dry_run", "skipped_cooldown", "skipped_rate_limit", "refused")


class Ledger:
    def __init__(self, config: RemediationConfig, clock) -> None:
        self.clock = clock
        self.path = audit_path(config)
        self._audit_config = config.audit
        self.audit = AuditLog(self.path, config.audit.max_bytes, config.audit.backups)
        self.counts = {(a, r): 0 for a in ACTIONS for r in RESULTS}
        self.dry_run = False
        self._rejected_window = 0.0
        self._rejected_in_window = 0
        self._rejected_suppressed = 0

    def reconfigure(self, config: RemediationConfig) -> None:
        """Reopen the audit log when its settings changed; raises OSError (nothing changed)."""
        path = audit_path(config)
        if (path, config.audit) == (self.path, self._audit_config):
            return
        audit = AuditLog(path, config.audit.max_bytes, config.audit.backups)
        self.audit.close()
        self.audit, self.path, self._audit_config = audit, path, config.audit

    def final(self, action: str, target: str, result: str, reason: str, trigger: str,
              detail: dict[str, Any], *, job_id: str | None = None) -> ActionEvent:
        """A decision that is final: counted, logged and audited."""
        reason = redact.scrub_text(reason)
        detail = redact.scrub({k: v for k, v in detail.items() if v is not None})
        if job_id:
            detail["id"] = job_id  # pairs with the audit log's "started" record
        ev = ActionEvent(t=self.clock(), action=action, target=target, result=result,
                         reason=reason, trigger=trigger, detail=detail)
        self.counts[(action, result)] = self.counts.get((action, result), 0) + 1
        # the one log line of an action (the JSON form goes to the events log)
        log.log(logfmt.level(ev), "%s", logfmt.human_line(ev, with_time=False))
        record = {**msgspec.to_builtins(ev), "dry_run": self.dry_run}
        if job_id:
            record["id"] = job_id
        self._submit(record)
        return ev

    def started(self, action: str, target: str, trigger: str, detail: dict[str, Any],
                job_id: str) -> concurrent.futures.Future[None]:
        """The "started" record of an action, which must be on disk before the action runs:
        the future fails (and nothing is written later) when the audit log cannot take it."""
        return self.audit.submit(self._record({
            "t": self.clock(), "action": action, "target": target, "result": "started",
            "trigger": trigger, "detail": detail, "id": job_id}), durable=True)

    def note(self, what: str, **extra: Any) -> None:
        self._submit({"t": self.clock(), "note": what, "pid": os.getpid(), **extra})

    def rejected(self, status: int, reason: str, peer: str | None) -> None:
        """A webhook request answered with an error. At most REJECTED_PER_SECOND records a
        second, the rest counted in the next one: a flood of bad requests must not rotate
        the actions out of the audit log."""
        now = self.clock()
        if now - self._rejected_window >= 1.0:
            self._rejected_window, self._rejected_in_window = now, 0
        if self._rejected_in_window >= REJECTED_PER_SECOND:
            self._rejected_suppressed += 1
            return
        self._rejected_in_window += 1
        record = {"t": now, "note": "webhook_rejected", "status": status, "reason": reason,
                  "peer": peer}
        if self._rejected_suppressed:
            record["suppressed_before"] = self._rejected_suppressed
            self._rejected_suppressed = 0
        self._submit(record)

    def _submit(self, record: dict[str, Any]) -> None:
        try:
            self.audit.submit(self._record(record))
        except ValueError as exc:  # closed
            log.error("remediation: audit log %s: %s", self.path, exc)

    @staticmethod
    def _record(record: dict[str, Any]) -> dict[str, Any]:
        return redact.scrub(record)

    def close(self) -> None:
        self.audit.close()

    @property
    def audit_path(self) -> Path:
        return self.path
