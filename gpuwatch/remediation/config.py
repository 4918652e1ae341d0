"""Remediation hooks, policy, guardrails and the Alertmanager webhook.

Out of the box only read-only actions run (snapshot); flush, signal and exec each need
`enabled = true` in their own section.
"""

from __future__ import annotations

import re
import signal as _signal
from typing import Annotated

import msgspec

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]

ACTIONS = ("flush", "snapshot", "signal", "exec")
SEVERITIES = ("warning", "critical", "*")
SCOPES = ("process", "gpu", "engine", "*")
# What each action accepts after a colon ("snapshot:history", "signal:SIGTERM").
ACTION_ARGS = {"flush": ("", "probe", "engine"), "snapshot": ("", "history")}


def parse_action(token: str) -> tuple[str, str]:
    """'signal:SIGUSR2' -> ('signal', 'SIGUSR2'); raises ValueError naming what is wrong."""
    name, _, arg = token.strip().partition(":")
    if name not in ACTIONS:
        raise ValueError(f"unknown action {token!r} (one of {', '.join(ACTIONS)})")
    if name == "signal":
        if arg:
            signal_number(arg)
    elif name == "exec":
        if arg:
            raise ValueError(f"{token!r}: exec takes no argument (see remediation.exec.argv)")
    elif arg not in ACTION_ARGS[name]:
        allowed = ", ".join(a for a in ACTION_ARGS[name] if a)
        raise ValueError(f"{token!r}: {name} accepts :{allowed}")
    return name, arg


def signal_number(name: str) -> int:
    """'SIGUSR1', 'USR1' or '10' -> 10."""
    text = name.strip().upper()
    if text.isdigit():
        num = int(text)
        if num not in {s.value for s in _signal.Signals}:
            raise ValueError(f"unknown signal {name!r}")
        return num
    try:
        return _signal.Signals[text if text.startswith("SIG") else "SIG" + text].value
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


def _check_actions(where: str, actions: list[str]) -> None:
    if not actions:
        raise ValueError(f"{where}.actions: must name at least one action")
    for i, token in enumerate(actions):
        try:
            parse_action(token)
        except ValueError as exc:
            raise ValueError(f"{where}.actions[{i}]: {exc}") from None


class EscalationRule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """(signal, severity, scope) -> ordered actions. The first action runs when the condition
    fires; each next one if it is still firing `escalate_after_seconds` later (0: all at once)."""

    signal: str
    severity: str = "critical"
    scope: str = "*"
    actions: list[str]
    escalate_after_seconds: NonNegFloat = 300.0


class AllowRule(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A process may be signalled when every field given here matches it."""

    name: str = ""  # process name, shell-style pattern (fnmatch)
    cmdline: str = ""  # regular expression searched in the space-joined command line
    user: str = ""  # user name, exact


class SignalConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = False
    signal: str = "SIGUSR1"
    allow: list[AllowRule] = []


class ExecConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = False
    argv: list[str] = []
    # Indices of argv elements that are secrets (a token passed as an argument): masked in
    # /api/state, logs, events and the audit log.
    secret_args: list[int] = []
    timeout_seconds: PositiveFloat = 30.0
    # Extra environment for the command; the daemon's own environment is not passed on.
    env: dict[str, str] = {}


class FlushEndpoint(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    engine: str  # the configured engine name
    url: str  # e.g. http://127.0.0.1:8000/reset_prefix_cache
    method: str = "POST"
    headers: dict[str, str] = {}


class FlushConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = False
    probe_timeout_seconds: PositiveFloat = 10.0
    http_timeout_seconds: PositiveFloat = 10.0
    # Explicit endpoints; otherwise vLLM / SGLang engines get theirs derived from their URL.
    endpoints: list[FlushEndpoint] = []


class SnapshotConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = True
    dir: str = ""  # default: <state dir>/snapshots
    max_total_bytes: PositiveInt = 2 * 1024**3
    # A user's snapshots evict only that user's older ones, so each user gets a share of
    # the total, and one snapshot a part of that share (each at most the one above it).
    max_user_bytes: PositiveInt = 512 * 1024**2
    max_snapshot_bytes: PositiveInt = 256 * 1024**2
    history: bool = False  # also dump the allocation history the probe recorded
    probe_timeout_seconds: PositiveFloat = 30.0


class AuditConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: str = ""  # default: <state dir>/audit.jsonl
    max_bytes: PositiveInt = 16 * 1024**2
    backups: Annotated[int, msgspec.Meta(ge=0)] = 5


class RemediationConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = True
    dry_run: bool = False
    # Per (action, target): no second run within this time.
    cooldown_seconds: NonNegFloat = 600.0
    # Global: at most rate_limit actions per rate_window_seconds.
    rate_limit: PositiveInt = 20
    rate_window_seconds: PositiveFloat = 3600.0
    max_concurrent: PositiveInt = 2
    # Use the threshold table's action on red (memory_zone critical).
    table_actions: bool = True
    # Checked in order, before the table's and the built-in defaults.
    escalation: list[EscalationRule] = []
    snapshot: SnapshotConfig = msgspec.field(default_factory=SnapshotConfig)
    flush: FlushConfig = msgspec.field(default_factory=FlushConfig)
    signal: SignalConfig = msgspec.field(default_factory=SignalConfig)
    exec: ExecConfig = msgspec.field(default_factory=ExecConfig)
    audit: AuditConfig = msgspec.field(default_factory=AuditConfig)

    def __post_init__(self) -> None:
        for i, rule in enumerate(self.escalation):
            where = f"escalation[{i}]"  # the loader prefixes "remediation: "
            if rule.severity not in SEVERITIES:
                raise ValueError(f"{where}.severity: one of {', '.join(SEVERITIES)}")
            if rule.scope not in SCOPES:
                raise ValueError(f"{where}.scope: one of {', '.join(SCOPES)}")
            _check_actions(where, rule.actions)
            for token in rule.actions:
                self.require_enabled(where, parse_action(token)[0])
        try:
            signal_number(self.signal.signal)
        except ValueError as exc:
            raise ValueError(f"signal.signal: {exc}") from None
        for i, rule in enumerate(self.signal.allow):
            if not (rule.name or rule.cmdline or rule.user):
                raise ValueError(f"signal.allow[{i}]: give name, cmdline or user")
            if rule.cmdline:
                try:
                    re.compile(rule.cmdline)
                except re.error as exc:
                    raise ValueError(f"signal.allow[{i}].cmdline: {exc}") from None
        if self.exec.enabled and not self.exec.argv:
            raise ValueError("exec.argv: required when exec is enabled")
        bad = [i for i in self.exec.secret_args if not 0 <= i < len(self.exec.argv)]
        if bad:
            raise ValueError(f"exec.secret_args: {bad} not an index of exec.argv "
                             f"(0 to {len(self.exec.argv) - 1})")
        for i, ep in enumerate(self.flush.endpoints):
            if not ep.url.startswith(("http://", "https://")):
                raise ValueError(f"flush.endpoints[{i}].url: must be http(s)://")
            if ep.method.upper() not in ("GET", "POST"):
                raise ValueError(f"flush.endpoints[{i}].method: GET or POST")

    def enabled_actions(self) -> set[str]:
        return {a for a in ACTIONS if getattr(self, a).enabled}

    def require_enabled(self, where: str, action: str) -> None:
        if action not in self.enabled_actions():
            raise ValueError(
                f"{where}: {action!r} is not enabled; set remediation.{action}.enabled = true"
            )


class WebhookRoute(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Alerts this route takes: alertname (regular expression, full match; empty: any) and
    labels equal to `match`. The first matching route wins."""

    alertname: str = ""
    match: dict[str, str] = {}
    actions: list[str]


class WebhookConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Without a token the /alertmanager endpoint is disabled.
    token: str = ""
    max_body_bytes: PositiveInt = 256 * 1024
    # Empty: every firing alert takes a snapshot (read-only) of the GPU / process it names.
    routes: list[WebhookRoute] = []
    # A notification for an alert already acted on (same fingerprint and start) is ignored
    # for this long.
    dedup_seconds: PositiveFloat = 86400.0

    def __post_init__(self) -> None:
        for i, route in enumerate(self.routes):
            where = f"routes[{i}]"  # the loader prefixes "webhook: "
            _check_actions(where, route.actions)
            if route.alertname:
                try:
                    re.compile(route.alertname)
                except re.error as exc:
                    raise ValueError(f"{where}.alertname: {exc}") from None

    def check_against(self, remediation: RemediationConfig) -> None:
        """Every action a route names must be enabled in remediation (explicit opt-in)."""
        for i, route in enumerate(self.routes):
            for token in route.actions:
                remediation.require_enabled(f"webhook.routes[{i}]", parse_action(token)[0])
