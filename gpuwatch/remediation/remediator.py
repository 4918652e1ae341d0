"""The object the daemon drives: decides on each tick's events (and on Alertmanager's
alerts), passes every action through the guardrails, runs the hooks in the background and
accounts for every action and skip (ledger: audit log and counters).

Parts live beside it: carrying out actions (runner, with flushing and identity), the
accounting (ledger), where files go (paths); the webhook (webhook) only knows the Actor
interface this class offers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gpuwatch import redact
from gpuwatch.events import ActionEvent, Event
from gpuwatch.exporter import server
from gpuwatch.model import ATTRIBUTION_FIELDS
from gpuwatch.remediation import targets
from gpuwatch.remediation.config import RemediationConfig, WebhookConfig
from gpuwatch.remediation.guardrails import Guardrails
from gpuwatch.remediation.hooks import HookFailed, Refused, Target
from gpuwatch.remediation.ledger import RESULTS, Ledger
from gpuwatch.remediation.paths import state_dir
from gpuwatch.remediation.policy import Action, Plan, Policy
from gpuwatch.remediation.runner import HookRunner

if TYPE_CHECKING:
    from gpuwatch.remediation.webhook import AlertmanagerWebhook

__all__ = ["RESULTS", "Remediator", "state_dir"]

log = logging.getLogger(__name__)

# Running actions get this long to finish when the daemon stops, and cancelled ones
# CANCEL_GRACE_SECONDS more: inside the daemon's 10 s stop deadline.
SHUTDOWN_GRACE_SECONDS = 5.0
CANCEL_GRACE_SECONDS = 2.0


@dataclass
class _Ladder:
    """An escalation in progress for one firing condition."""

    event: Event
    plan: Plan
    step: int
    last: float


@dataclass
class _Job:
    """One admitted action waiting to run."""

    id: str
    action: Action
    target: Target
    event: Event
    trigger: str
    context: dict[str, Any]
    admitted_at: float


class Remediator:
    def __init__(self, config: RemediationConfig, webhook: WebhookConfig, *, probe_dir: str,
                 table: Any = None, dry_run: bool = False, clock=time.time) -> None:
        webhook.check_against(config)  # routes may only name enabled hooks
        _remember_secrets(config, webhook)
        self.config = config
        self.webhook_config = webhook
        self.probe_dir = probe_dir
        self._dry_run_flag = dry_run
        self.dry_run = dry_run or config.dry_run
        self.clock = clock
        self.policy = Policy(config, table)
        self.guard = Guardrails(
            cooldown_seconds=config.cooldown_seconds, rate_limit=config.rate_limit,
            rate_window_seconds=config.rate_window_seconds,
            max_concurrent=config.max_concurrent, clock=clock,
        )
        self.ledger = Ledger(config, clock)
        self.ledger.dry_run = self.dry_run
        self.hooks = HookRunner(config, probe_dir, clock)
        self._webhook: AlertmanagerWebhook | None = None
        self._snap: Any = None
        self._ladders: dict[tuple, _Ladder] = {}
        self._tasks: set[asyncio.Task] = set()
        self._done: list[ActionEvent] = []
        self._ids = itertools.count(1)
        self._run_id = f"{int(clock()):x}"
        self.ledger.note("started", dry_run=self.dry_run)

    @property
    def webhook(self) -> AlertmanagerWebhook:
        """The /alertmanager handler, made at its first request: a daemon that Alertmanager
        never calls never loads it."""
        if self._webhook is None:
            from gpuwatch.remediation.webhook import AlertmanagerWebhook

            self._webhook = AlertmanagerWebhook(self, self.webhook_config, clock=self.clock)
        return self._webhook

    @property
    def audit(self):
        return self.ledger.audit

    @property
    def audit_path(self):
        return self.ledger.path

    # -- the daemon's interface ------------------------------------------------------------

    async def on_events(self, events: list[Event], snap: Any) -> list[ActionEvent]:
        """Called after every tick with that tick's new events; never raises."""
        out: list[ActionEvent] = []
        if not self.config.enabled:
            return self.take_done()
        try:
            self._observe(snap)
            for ev in events:
                if ev.state == "resolved":
                    self._ladders.pop(ev.key, None)
                    continue
                plan = self.policy.plan(ev, snap)
                if plan is None:
                    self._ladders.pop(ev.key, None)
                    continue
                out += self.act(ev, plan.steps[0], trigger="policy", context={"plan": plan.source})
                if len(plan.steps) > 1:
                    self._ladders[ev.key] = _Ladder(ev, plan, 0, self.clock())
                else:
                    self._ladders.pop(ev.key, None)
            out += self._escalate(snap)
        except Exception:
            log.exception("remediation: error while handling events (continuing)")
        return out + self.take_done()

    def reconfigure(self, config: RemediationConfig, webhook: WebhookConfig) -> None:
        """Take new settings (SIGHUP) keeping counters, cooldowns, escalations and the
        webhook's memory of alerts. Raises ValueError / OSError and changes nothing when
        the new settings cannot be used."""
        webhook.check_against(config)
        _remember_secrets(config, webhook)
        self.ledger.reconfigure(config)
        self.config = config
        self.webhook_config = webhook
        self.dry_run = self._dry_run_flag or config.dry_run
        self.ledger.dry_run = self.dry_run
        self.policy = Policy(config, self.policy.table)
        g = self.guard
        g.cooldown_seconds, g.rate_limit = config.cooldown_seconds, config.rate_limit
        g.rate_window_seconds, g.max_concurrent = (config.rate_window_seconds,
                                                   config.max_concurrent)
        self.hooks.reconfigure(config)
        if self._webhook is not None:  # else it is made with the new settings
            self._webhook.reconfigure(webhook)
        self.ledger.note("reconfigured", dry_run=self.dry_run)

    def routes(self) -> list[server.Route]:
        return [server.post("/alertmanager", self._alertmanager)]

    async def _alertmanager(self, request: server.Request) -> server.Response:
        return await self.webhook.handle(request)

    def counters(self) -> dict[tuple[str, str], int]:
        return dict(self.ledger.counts)

    async def close(self) -> None:
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=SHUTDOWN_GRACE_SECONDS)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=CANCEL_GRACE_SECONDS)
        await self.hooks.close()
        self.ledger.note("stopped")
        await asyncio.to_thread(self.ledger.close)

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the actions running now and their audit records; True when none is
        left."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        await asyncio.to_thread(self.ledger.audit.flush, 10.0 if timeout is None else timeout)
        return all(t.done() for t in self._tasks)

    def audit_rejected(self, status: int, reason: str, peer: str | None) -> None:
        """The webhook answered a request with an error (Actor interface)."""
        self.ledger.rejected(status, reason, peer)

    def take_done(self) -> list[ActionEvent]:
        """Results of background actions finished since the last on_events call."""
        done, self._done = self._done, []
        return done

    @property
    def snap(self) -> Any:
        return self._snap

    # -- deciding ---------------------------------------------------------------------------

    def _observe(self, snap: Any) -> None:
        self._snap = snap
        self.hooks.observe(snap)

    def _escalate(self, snap: Any) -> list[ActionEvent]:
        active = {e.key for e in getattr(snap, "active_events", ())}
        now = self.clock()
        out: list[ActionEvent] = []
        for key, ladder in list(self._ladders.items()):
            if key not in active:
                del self._ladders[key]
                continue
            if now - ladder.last < ladder.plan.escalate_after:
                continue
            ladder.step += 1
            ladder.last = now
            out += self.act(ladder.event, ladder.plan.steps[ladder.step], trigger="policy",
                            context={"plan": ladder.plan.source, "step": ladder.step})
            if ladder.step + 1 >= len(ladder.plan.steps):
                del self._ladders[key]
        return out

    def act(self, event: Event, actions: tuple[Action, ...], *, trigger: str,
            context: dict[str, Any]) -> list[ActionEvent]:
        """Decide each action now; admitted ones run in order in one background task.
        Returns the decisions already final (refusals, skips, dry runs)."""
        engine_pids = self.hooks.engine_pids()
        try:
            target: Target | None = targets.resolve(event, self._snap, engine_pids)
            refusal = ""
        except Refused as exc:
            target, refusal = None, str(exc)
        out: list[ActionEvent] = []
        jobs: list[_Job] = []
        for action in actions:
            name = action[0]
            label = target.label if target is not None else targets.event_label(event)
            ctx = {k: v for k, v in {**context, **_fields(event, target), "arg": action[1]}.items()
                   if v not in (None, "")}
            try:
                if not self.config.enabled:
                    raise Refused("remediation is disabled (remediation.enabled = false)")
                if name not in self.config.enabled_actions():
                    raise Refused(f"{name} is not enabled (opt in: remediation.{name}.enabled)")
                if target is None:
                    raise Refused(refusal)
                preview = self.hooks.precheck(action, target)
            except Refused as exc:
                out.append(self._final(name, label, "refused", str(exc), trigger, ctx))
                continue
            skip = self.guard.check(name, label)
            if skip is not None:
                out.append(self._final(name, label, skip[0], skip[1], trigger, ctx))
                continue
            admitted_at = self.guard.admit(name, label)
            if self.dry_run:
                self.guard.started(name, label)
                self.guard.finish()
                out.append(self._final(name, label, "dry_run", "dry run: not performed",
                                       trigger, {**ctx, **preview}))
                continue
            jobs.append(_Job(f"{self._run_id}-{next(self._ids)}", action, target, event,
                             trigger, ctx, admitted_at))
        if jobs:
            task = asyncio.get_running_loop().create_task(self._run_jobs(jobs))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return out

    # -- running ----------------------------------------------------------------------------

    async def _run_jobs(self, jobs: list[_Job]) -> None:
        for i, job in enumerate(jobs):
            name, label = job.action[0], job.target.label
            try:
                # On disk before the action runs: an action the audit log cannot account
                # for does not happen (and starts no cooldown).
                await asyncio.wrap_future(self.ledger.started(
                    name, label, job.trigger, job.context, job.id))
            except asyncio.CancelledError:
                self._cancelled(jobs[i:])
                return
            except (OSError, ValueError) as exc:
                self.guard.abandon(name, label, job.admitted_at)
                self._done.append(self._final(
                    name, label, "refused", f"audit log not writable ({exc}): not acting",
                    job.trigger, job.context, job_id=job.id))
                continue
            self.guard.started(name, label)
            try:
                detail = await self.hooks.run(job.action, job.target, job.context, {
                    "id": job.id, "action": "exec", "target": label, "trigger": job.trigger,
                    "dry_run": False, "message": job.event.message or None})
                result, reason = "ok", ""
            except Refused as exc:
                detail, result, reason = {}, "refused", str(exc)
            except HookFailed as exc:
                detail, result, reason = exc.detail, "failed", str(exc)
            except asyncio.CancelledError:
                self._cancelled(jobs[i:])
                return
            except Exception as exc:  # a hook bug must not take the daemon down
                log.exception("remediation: %s on %s raised", name, label)
                detail, result, reason = {}, "failed", f"{exc.__class__.__name__}: {exc}"
            self.guard.finish(name, label)
            self._done.append(self._final(name, label, result, reason, job.trigger,
                                          {**job.context, **detail}, job_id=job.id))

    def _cancelled(self, jobs: list[_Job]) -> None:
        for job in jobs:
            self.guard.finish(job.action[0], job.target.label)
            self._done.append(self._final(
                job.action[0], job.target.label, "failed", "cancelled at shutdown",
                job.trigger, job.context, job_id=job.id))

    def _final(self, action: str, target: str, result: str, reason: str, trigger: str,
               detail: dict[str, Any], *, job_id: str | None = None) -> ActionEvent:
        return self.ledger.final(action, target, result, reason, trigger, detail,
                                 job_id=job_id)


def _remember_secrets(config: RemediationConfig, webhook: WebhookConfig) -> None:
    redact.remember({"remediation": msgspec.to_builtins(config),
                     "webhook": msgspec.to_builtins(webhook)})


def _fields(event: Event, target: Target | None) -> dict[str, Any]:
    """The flat facts of an action: the event's, and the target's where it was resolved."""
    out = {"signal": event.signal, "severity": event.severity, "gpu_uuid": event.gpu_uuid,
           "pid": event.pid, "engine": event.engine, "value": event.value,
           "threshold": event.threshold}
    # whose workload it was (pod, container, Slurm job), when the event names it
    out.update({k: getattr(event, k) for k in ATTRIBUTION_FIELDS if getattr(event, k, None)})
    if target is not None:
        out.update({"gpu_uuid": target.gpu_uuid or event.gpu_uuid, "gpu_index": target.gpu_index,
                    "pid": target.pid if target.pid is not None else event.pid,
                    "create_time": target.create_time, "process": target.process_name,
                    "engine": target.engine or event.engine})
    return out
