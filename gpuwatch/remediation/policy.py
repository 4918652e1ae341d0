"""Which actions a firing event calls for, in which order.

Configured escalation rules are checked first, in order; then, for a red zone, the
threshold table row's own action; then the built-in defaults, which are read-only: a
critical leak or red zone takes a snapshot of the offending process.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

from gpuwatch.events import ActionEvent, Event
from gpuwatch.remediation.config import RemediationConfig, parse_action
from gpuwatch.remediation.targets import event_label

Action = tuple[str, str]  # (name, argument), e.g. ("signal", "SIGUSR1")


@dataclass(frozen=True)
class Plan:
    steps: tuple[tuple[Action, ...], ...]
    escalate_after: float
    source: str  # "escalation[0]", "table:<row>", "default"


DEFAULTS: dict[tuple[str, str], tuple[Action, ...]] = {
    ("memory_leak", "critical"): (("snapshot", ""),),
    ("memory_zone", "critical"): (("snapshot", ""),),
}


def scope_of(event: Event) -> str:
    if event.pid is not None:
        return "process"
    if event.gpu_uuid:
        return "gpu"
    if event.engine:
        return "engine"
    return ""


class Policy:
    def __init__(self, config: RemediationConfig, table: Any = None) -> None:
        self.config = config
        self.table = table

    def plan(self, event: Event, snap: Any = None) -> Plan | None:
        if event.state != "firing":
            return None
        scope = scope_of(event)
        for i, rule in enumerate(self.config.escalation):
            if (fnmatch.fnmatchcase(event.signal, rule.signal)
                    and rule.severity in ("*", event.severity)
                    and rule.scope in ("*", scope)):
                actions = tuple(parse_action(a) for a in rule.actions)
                if rule.escalate_after_seconds > 0:
                    steps = tuple((a,) for a in actions)
                else:
                    steps = (actions,)
                return Plan(steps, rule.escalate_after_seconds, f"escalation[{i}]")
        if (self.config.table_actions and event.signal == "memory_zone"
                and event.severity == "critical"):
            row_name, actions = table_action(self.table, snap, event.gpu_uuid)
            if actions:
                return Plan((actions,), 0.0, f"table:{row_name}")
        default = DEFAULTS.get((event.signal, event.severity))
        if default:
            return Plan((default,), 0.0, "default")
        return None


def planned_actions(policy: Policy, events: list[Event], snap: Any) -> list[ActionEvent]:
    """What the policy would start with for each firing event, as dry-run action events —
    pure and deterministic, for `gpuwatch replay` (guardrails and identity checks, which
    depend on the live host, are the daemon's)."""
    out: list[ActionEvent] = []
    for ev in events:
        plan = policy.plan(ev, snap)
        if plan is None:
            continue
        target = event_label(ev)
        for name, arg in plan.steps[0]:
            detail = {"plan": plan.source, "signal": ev.signal, "severity": ev.severity}
            if arg:
                detail["arg"] = arg
            out.append(ActionEvent(t=ev.t, action=name, target=target, result="dry_run",
                                   reason="replay: planned, not performed", trigger="policy",
                                   detail=detail))
    return out


def table_action(table: Any, snap: Any, uuid: str | None) -> tuple[str, tuple[Action, ...]]:
    """The on-red actions of the table row this GPU matches; ('', ()) if none."""
    gpu = _gpu(snap, uuid) if uuid else None
    match = getattr(table, "match", None)
    if gpu is None or not gpu.memory_total_bytes or not callable(match):
        return "", ()
    try:
        row = match(gpu.name, gpu.memory_total_bytes)
    except ValueError:
        return "", ()
    return str(getattr(row, "id", "")), row_actions(row)


def row_actions(row: Any) -> tuple[Action, ...]:
    """A row's on_critical (Action(hook, signal, kind) objects, or 'hook:arg' strings)."""
    out: list[Action] = []
    for spec in getattr(row, "on_critical", None) or getattr(row, "action", None) or ():
        if isinstance(spec, str):
            token = spec
        else:
            hook = getattr(spec, "hook", "")
            arg = {"signal": getattr(spec, "signal", ""),
                   "snapshot": "history" if getattr(spec, "kind", "") == "history" else ""
                   }.get(hook, "")
            token = f"{hook}:{arg}" if arg else hook
        try:
            action = parse_action(token)
        except ValueError:
            continue  # the table's loader validates its rows; an odd one is not acted on
        if action not in out:
            out.append(action)
    return tuple(out)


def _gpu(snap: Any, uuid: str) -> Any:
    tick = getattr(snap, "tick", None)
    return next((g for g in getattr(tick, "gpus", ()) if g.uuid == uuid), None)
