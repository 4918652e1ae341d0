"""The object the daemon drives: decides on each tick's events (and on Alertmanager's
alerts), passes every action through the guardrails, runs the hooks in the background and
accounts for every action and skip in the audit log and the counters."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from gpuwatch import redact
from gpuwatch.events import ActionEvent, Event
from gpuwatch.remediation import targets
from gpuwatch.remediation.audit import AuditLog
from gpuwatch.remediation.config import (
    ACTIONS,
    RemediationConfig,
    WebhookConfig,
    signal_number,
)
from gpuwatch.remediation.guardrails import Guardrails
from gpuwatch.remediation.hooks import HookFailed, Refused, Target
from gpuwatch.remediation.hooks import exec as exec_hook
from gpuwatch.remediation.hooks import flush as flush_hook
from gpuwatch.remediation.hooks import signal as signal_hook
from gpuwatch.remediation.hooks import snapshot as snapshot_hook
from gpuwatch.remediation.policy import Action, Plan, Policy
from gpuwatch.remediation.webhook import AlertmanagerWebhook

log = logging.getLogger(__name__)

RESULTS = ("ok", "failed", "dry_run", "skipped_cooldown", "skipped_rate_limit", "refused")
SHUTDOWN_GRACE_SECONDS = 10.0


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
        self.audit_path = _audit_path(config)
        self.audit = AuditLog(self.audit_path, config.audit.max_bytes, config.audit.backups)
        self.snapshot_dir = config.snapshot.dir or str(state_dir() / "snapshots")
        self.webhook = AlertmanagerWebhook(self, webhook, clock=clock)
        self._counts = {(a, r): 0 for a in ACTIONS for r in RESULTS}
        self._snap: Any = None
        self._ladders: dict[tuple, _Ladder] = {}
        self._tasks: set[asyncio.Task] = set()
        self._done: list[ActionEvent] = []
        self._engines: dict[str, dict[str, Any]] = {}
        self._probes: dict[int, float | None] = {}
        self._session: aiohttp.ClientSession | None = None
        self._ids = itertools.count(1)
        self._run_id = f"{int(clock()):x}"
        self._signum = signal_number(config.signal.signal)
        self._audit_note("started", dry_run=self.dry_run)

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
        audit = self.audit
        path = _audit_path(config)
        if (path, config.audit) != (self.audit_path, self.config.audit):
            audit = AuditLog(path, config.audit.max_bytes, config.audit.backups)
        if audit is not self.audit:
            self.audit.close()
            self.audit, self.audit_path = audit, path
        self.config = config
        self.webhook_config = webhook
        self.dry_run = self._dry_run_flag or config.dry_run
        self.policy = Policy(config, self.policy.table)
        g = self.guard
        g.cooldown_seconds, g.rate_limit = config.cooldown_seconds, config.rate_limit
        g.rate_window_seconds, g.max_concurrent = (config.rate_window_seconds,
                                                   config.max_concurrent)
        self.snapshot_dir = config.snapshot.dir or str(state_dir() / "snapshots")
        self._signum = signal_number(config.signal.signal)
        self.webhook.reconfigure(webhook)
        self._audit_note("reconfigured", dry_run=self.dry_run)

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/alertmanager", self.webhook.handle)]

    def counters(self) -> dict[tuple[str, str], int]:
        return dict(self._counts)

    async def close(self) -> None:
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=SHUTDOWN_GRACE_SECONDS)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._audit_note("stopped")
        self.audit.close()

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for the actions running now; True when none is left."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        return all(t.done() for t in self._tasks)

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
        tick = getattr(snap, "tick", None)
        if tick is None:
            return
        for eng in tick.engines:
            info = self._engines.setdefault(eng.name, {})
            info.update({"kind": eng.kind, "url": eng.url})
            if eng.pids:
                info["pids"] = list(eng.pids)
        if tick.probes:
            self._probes = {p.pid: p.create_time for p in tick.probes}

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
        engine_pids = {n: i.get("pids", []) for n, i in self._engines.items()}
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
                preview = self._precheck(action, target)
            except Refused as exc:
                out.append(self._final(name, label, "refused", str(exc), trigger, ctx))
                continue
            skip = self.guard.check(name, label)
            if skip is not None:
                out.append(self._final(name, label, skip[0], skip[1], trigger, ctx))
                continue
            self.guard.admit(name, label)
            if self.dry_run:
                self.guard.finish()
                out.append(self._final(name, label, "dry_run", "dry run: not performed",
                                       trigger, {**ctx, **preview}))
                continue
            job = _Job(f"{self._run_id}-{next(self._ids)}", action, target, event, trigger, ctx)
            try:
                self._audit_write({"t": self.clock(), "action": name, "target": label,
                                   "result": "started", "trigger": trigger, "detail": ctx,
                                   "id": job.id})
            except OSError as exc:
                self.guard.finish()
                out.append(self._final(name, label, "refused",
                                       f"audit log not writable ({exc}): not acting", trigger,
                                       ctx, audit=False))
                continue
            jobs.append(job)
        if jobs:
            task = asyncio.get_running_loop().create_task(self._run_jobs(jobs))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return out

    def _precheck(self, action: Action, target: Target) -> dict[str, Any]:
        """Action-specific checks that need no side effect; raises Refused. Returns what a
        dry run reports it would do."""
        name, arg = action
        if name == "signal":
            if target.pid is None:
                raise Refused("signal needs a process, and the event names none")
            signum = signal_number(arg) if arg else self._signum
            return signal_hook.send(target.pid, target.create_time, signum,
                                    self.config.signal.allow, dry_run=True)
        if name == "flush":
            how = self._flush_plan(target, arg)
            if not how:
                raise Refused(f"nothing to flush for {target.label}: no probe in the process "
                              "and no flush endpoint for its engine")
            return {"would_flush": [h[0] for h in how]}
        if name == "snapshot":
            if target.gpu_uuid is None:
                raise Refused(f"snapshot needs a GPU; {target.label} runs on none known")
            return {"would_snapshot": target.label, "probe": self._has_probe(target)}
        if name == "exec":
            return {"would_exec": self._shown_argv()}
        raise Refused(f"unknown action {name!r}")

    # -- running ----------------------------------------------------------------------------

    async def _run_jobs(self, jobs: list[_Job]) -> None:
        for i, job in enumerate(jobs):
            name = job.action[0]
            try:
                detail = await self._run_hook(job)
                result, reason = "ok", ""
            except Refused as exc:
                detail, result, reason = {}, "refused", str(exc)
            except HookFailed as exc:
                detail, result, reason = exc.detail, "failed", str(exc)
            except asyncio.CancelledError:
                for left in jobs[i:]:
                    self.guard.finish()
                    self._done.append(self._final(
                        left.action[0], left.target.label, "failed", "cancelled at shutdown",
                        left.trigger, left.context, job_id=left.id))
                return
            except Exception as exc:  # a hook bug must not take the daemon down
                log.exception("remediation: %s on %s raised", name, job.target.label)
                detail, result, reason = {}, "failed", f"{exc.__class__.__name__}: {exc}"
            self.guard.finish()
            self._done.append(self._final(name, job.target.label, result, reason, job.trigger,
                                          {**job.context, **detail}, job_id=job.id))

    async def _run_hook(self, job: _Job) -> dict[str, Any]:
        name, arg = job.action
        target = job.target
        if name == "signal":
            signum = signal_number(arg) if arg else self._signum
            return signal_hook.send(target.pid, target.create_time, signum,
                                    self.config.signal.allow)
        if name == "snapshot":
            cfg = self.config.snapshot
            return await snapshot_hook.take(
                self._snap, target, job.context, directory=self.snapshot_dir,
                max_total_bytes=cfg.max_total_bytes, probe_dir=self.probe_dir,
                has_probe=self._has_probe(target), history=cfg.history or arg == "history",
                timeout=cfg.probe_timeout_seconds, t=self.clock(),
            )
        if name == "flush":
            return await self._flush(target, arg)
        if name == "exec":
            payload = {**job.context, "id": job.id, "action": "exec", "target": target.label,
                       "trigger": job.trigger, "dry_run": False,
                       "message": job.event.message or None}
            detail = await exec_hook.run(self.config.exec.argv, payload,
                                         timeout=self.config.exec.timeout_seconds,
                                         extra_env=self.config.exec.env)
            return {**detail, "argv": self._shown_argv()}
        raise Refused(f"unknown action {name!r}")

    def _shown_argv(self) -> list[str]:
        return redact.config_for_display({"remediation": {"exec": {
            "argv": self.config.exec.argv, "secret_args": self.config.exec.secret_args}}},
        )["remediation"]["exec"]["argv"]

    def _has_probe(self, target: Target) -> bool:
        if target.pid is None or target.pid not in self._probes:
            return False
        probe_ct = self._probes[target.pid]
        # A probe record left by an earlier process with the same pid does not count.
        return probe_ct is None or target.create_time is None or abs(
            probe_ct - target.create_time) <= signal_hook.CREATE_TIME_TOLERANCE

    def _flush_plan(self, target: Target, arg: str) -> list[tuple[str, Any]]:
        how: list[tuple[str, Any]] = []
        if arg in ("", "probe") and self._has_probe(target):
            how.append(("probe", target.pid))
        if arg in ("", "engine") and not how:
            ep = self._endpoint_for(target)
            if ep is not None:
                how.append(("engine", ep))
        return how

    async def _flush(self, target: Target, arg: str) -> dict[str, Any]:
        how = self._flush_plan(target, arg)
        if not how:
            raise Refused(f"nothing to flush for {target.label}")
        kind, what = how[0]
        cfg = self.config.flush
        if kind == "probe":
            return await flush_hook.via_probe(self.probe_dir, what, cfg.probe_timeout_seconds)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return await flush_hook.via_engine(self._session, what, cfg.http_timeout_seconds)

    def _endpoint_for(self, target: Target) -> flush_hook.Endpoint | None:
        engine = target.engine
        if engine is None and target.pid is not None:
            engine = next((n for n, i in self._engines.items()
                           if target.pid in i.get("pids", ())), None)
        if engine is None:
            return None
        for ep in self.config.flush.endpoints:
            if ep.engine == engine:
                return flush_hook.Endpoint(engine, ep.url, ep.method.upper(), "", ep.headers)
        info = dict(self._engines.get(engine, {}))
        headers: dict[str, str] = {}
        for eng_cfg in getattr(getattr(self._snap, "config", None), "engines", None) or ():
            if getattr(eng_cfg, "name", None) == engine:
                if getattr(eng_cfg, "kind", "auto") != "auto":
                    info["kind"] = eng_cfg.kind
                info.setdefault("url", eng_cfg.url)
                headers.update(getattr(eng_cfg, "headers", {}) or {})
                if getattr(eng_cfg, "bearer_token", ""):
                    headers["Authorization"] = f"Bearer {eng_cfg.bearer_token}"
        kind = info.get("kind")
        if kind in (None, "", "auto"):  # what the engines analyzer recognised
            derived = getattr(getattr(self._snap, "derived", None), "engines", {}).get(engine)
            kind = getattr(derived, "kind", "") or ""
        return flush_hook.derive_endpoint(engine, kind, info.get("url", ""), headers)

    # -- accounting -------------------------------------------------------------------------

    def _final(self, action: str, target: str, result: str, reason: str, trigger: str,
               detail: dict[str, Any], *, audit: bool = True,
               job_id: str | None = None) -> ActionEvent:
        # Reasons and details quote URLs, hook output and commands: scrubbed before they go to
        # the log, the events log, /api/state and the audit log.
        reason = redact.scrub_text(reason)
        detail = redact.scrub({k: v for k, v in detail.items() if v is not None})
        if job_id:
            detail["id"] = job_id  # pairs with the audit log's "started" record
        ev = ActionEvent(t=self.clock(), action=action, target=target, result=result,
                         reason=reason, trigger=trigger, detail=detail)
        self._counts[(action, result)] = self._counts.get((action, result), 0) + 1
        level = logging.WARNING if result in ("failed", "refused") else logging.INFO
        log.log(level, "remediation: %s %s on %s%s", action, result, target,
                f": {reason}" if reason else "")
        if audit:
            record = {**msgspec.to_builtins(ev), "dry_run": self.dry_run}
            if job_id:
                record["id"] = job_id
            try:
                self._audit_write(record)
            except OSError as exc:
                log.error("remediation: audit log %s not writable: %s", self.audit_path, exc)
        return ev

    def _audit_write(self, record: dict[str, Any]) -> None:
        self.audit.write(redact.scrub(record))

    def _audit_note(self, what: str, **extra: Any) -> None:
        with contextlib.suppress(OSError):
            self.audit.write({"t": self.clock(), "note": what, "pid": os.getpid(), **extra})


def _remember_secrets(config: RemediationConfig, webhook: WebhookConfig) -> None:
    redact.remember({"remediation": msgspec.to_builtins(config),
                     "webhook": msgspec.to_builtins(webhook)})


def _audit_path(config: RemediationConfig) -> Path:
    return Path(config.audit.path or state_dir() / "audit.jsonl")


def _fields(event: Event, target: Target | None) -> dict[str, Any]:
    """The flat facts of an action: the event's, and the target's where it was resolved."""
    out = {"signal": event.signal, "severity": event.severity, "gpu_uuid": event.gpu_uuid,
           "pid": event.pid, "engine": event.engine, "value": event.value,
           "threshold": event.threshold}
    if target is not None:
        out.update({"gpu_uuid": target.gpu_uuid or event.gpu_uuid, "gpu_index": target.gpu_index,
                    "pid": target.pid if target.pid is not None else event.pid,
                    "create_time": target.create_time, "process": target.process_name,
                    "engine": target.engine or event.engine})
    return out
