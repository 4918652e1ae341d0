"""Carrying out actions for the remediator: what the samples tell about the targets (engines
and their pids, probes, pidfds of the processes on GPUs), the checks an action needs before
it may run, and the hook calls themselves.

Each hook (and flushing) is imported when an action of its kind is first checked or run: a
daemon that never acts never holds them in memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuwatch import redact
from gpuwatch.remediation.config import RemediationConfig, signal_number
from gpuwatch.remediation.hooks import Refused, Target
from gpuwatch.remediation.identity import ProcessHandles
from gpuwatch.remediation.paths import snapshot_dir
from gpuwatch.remediation.policy import Action

if TYPE_CHECKING:
    import aiohttp


class HookRunner:
    def __init__(self, config: RemediationConfig, probe_dir: str, clock) -> None:
        self.probe_dir = probe_dir
        self.clock = clock
        self.handles = ProcessHandles()
        self.engines: dict[str, dict[str, Any]] = {}
        self.probes: dict[int, float | None] = {}
        self.snap: Any = None
        self._session: aiohttp.ClientSession | None = None
        self.reconfigure(config)

    def reconfigure(self, config: RemediationConfig) -> None:
        self.config = config
        self.snapshot_dir = snapshot_dir(config)
        self._signum = signal_number(config.signal.signal)

    def observe(self, snap: Any) -> None:
        """Take what the latest sample says about engines, probes and processes."""
        self.snap = snap
        tick = getattr(snap, "tick", None)
        if tick is None:
            return
        for eng in tick.engines:
            info = self.engines.setdefault(eng.name, {})
            info.update({"kind": eng.kind, "url": eng.url})
            if eng.pids:
                info["pids"] = list(eng.pids)
        if tick.probes:
            self.probes = {p.pid: p.create_time for p in tick.probes}
        # A pidfd for each process when first seen: a signal later reaches that process or
        # none, whatever became of its pid.
        self.handles.observe((p.pid, p.create_time) for g in tick.gpus for p in g.processes)

    def engine_pids(self) -> dict[str, list[int]]:
        return {n: i.get("pids", []) for n, i in self.engines.items()}

    def precheck(self, action: Action, target: Target) -> dict[str, Any]:
        """Action-specific checks that need no side effect; raises Refused. Returns what a
        dry run reports it would do."""
        name, arg = action
        if name == "signal":
            from gpuwatch.remediation.hooks import signal as signal_hook

            if target.pid is None:
                raise Refused("signal needs a process, and the event names none")
            signum = signal_number(arg) if arg else self._signum
            return signal_hook.send(target.pid, target.create_time, signum,
                                    self.config.signal.allow, dry_run=True,
                                    pidfd=self._pidfd(target))
        if name == "flush":
            how = self._flush_plan(target, arg)
            if not how:
                raise Refused(f"nothing to flush for {target.label}: no probe in the process "
                              "and no flush endpoint for its engine")
            return {"would_flush": [h[0] for h in how]}
        if name == "snapshot":
            from gpuwatch.remediation import flushing

            if target.gpu_uuid is None:
                raise Refused(f"snapshot needs a GPU; {target.label} runs on none known")
            return {"would_snapshot": target.label,
                    "probe": flushing.has_probe(target, self.probes)}
        if name == "exec":
            return {"would_exec": self._shown_argv()}
        raise Refused(f"unknown action {name!r}")

    async def run(self, action: Action, target: Target, context: dict[str, Any],
                  payload: dict[str, Any]) -> dict[str, Any]:
        """Carry out one admitted action; returns its detail, raises Refused / HookFailed.
        payload: what an exec hook gets besides the context."""
        name, arg = action
        if name == "signal":
            from gpuwatch.remediation.hooks import signal as signal_hook

            signum = signal_number(arg) if arg else self._signum
            return signal_hook.send(target.pid, target.create_time, signum,
                                    self.config.signal.allow, pidfd=self._pidfd(target))
        if name == "snapshot":
            from gpuwatch.remediation import flushing
            from gpuwatch.remediation.hooks import snapshot as snapshot_hook

            cfg = self.config.snapshot
            return await snapshot_hook.take(
                self.snap, target, context, directory=self.snapshot_dir,
                max_total_bytes=cfg.max_total_bytes, max_user_bytes=cfg.max_user_bytes,
                max_snapshot_bytes=cfg.max_snapshot_bytes, probe_dir=self.probe_dir,
                has_probe=flushing.has_probe(target, self.probes),
                history=cfg.history or arg == "history",
                timeout=cfg.probe_timeout_seconds, t=self.clock(),
            )
        if name == "flush":
            return await self._flush(target, arg)
        if name == "exec":
            from gpuwatch.remediation.hooks import exec as exec_hook

            detail = await exec_hook.run(self.config.exec.argv, {**context, **payload},
                                         timeout=self.config.exec.timeout_seconds,
                                         extra_env=self.config.exec.env)
            return {**detail, "argv": self._shown_argv()}
        raise Refused(f"unknown action {name!r}")

    def _shown_argv(self) -> list[str]:
        return redact.config_for_display({"remediation": {"exec": {
            "argv": self.config.exec.argv, "secret_args": self.config.exec.secret_args}}},
        )["remediation"]["exec"]["argv"]

    def _pidfd(self, target: Target) -> int | None:
        """A copy of the pidfd held since the target was first seen, if any."""
        try:
            return self.handles.dup(target.pid, target.create_time)
        except LookupError as exc:
            raise Refused(str(exc)) from None

    def _flush_plan(self, target: Target, arg: str) -> list[tuple[str, Any]]:
        from gpuwatch.remediation import flushing

        endpoint = flushing.endpoint_for(target, self.config, self.engines, self.snap)
        return flushing.plan(target, arg, self.probes, endpoint)

    async def _flush(self, target: Target, arg: str) -> dict[str, Any]:
        from gpuwatch.remediation.hooks import flush as flush_hook

        how = self._flush_plan(target, arg)
        if not how:
            raise Refused(f"nothing to flush for {target.label}")
        kind, what = how[0]
        cfg = self.config.flush
        if kind == "probe":
            return await flush_hook.via_probe(self.probe_dir, what, cfg.probe_timeout_seconds)
        if self._session is None:
            import aiohttp  # an engine flush is the only HTTP client remediation needs

            self._session = aiohttp.ClientSession()
        return await flush_hook.via_engine(self._session, what, cfg.http_timeout_seconds)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.handles.close()
