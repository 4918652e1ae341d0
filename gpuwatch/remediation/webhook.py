"""`POST /alertmanager`: Alertmanager's webhook (payload version 4) as a remediation trigger.

Bearer token required (constant-time compare); without a configured token the endpoint is
disabled. Only firing alerts act, each (fingerprint, startsAt) once. Every answer is a JSON
object; bad input gets a 4xx and an audit record, never a 500: a sender that can reach the
port must not be able to crash a handler or go unrecorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
from collections import OrderedDict
from typing import Any, Protocol

import msgspec

from gpuwatch.events import Event
from gpuwatch.exporter import server
from gpuwatch.remediation.config import RemediationConfig, WebhookConfig, parse_action

log = logging.getLogger(__name__)

DEDUP_MAX_ENTRIES = 10_000
YIELD_EVERY = 25
DEFAULT_ACTIONS = (("snapshot", ""),)
# Only ASCII digits name a pid or a GPU index: str.isdigit() also accepts superscript two
# (which int() refuses) and the Arabic-Indic digit one (which int() reads as 1).
_ASCII_NUMBER = re.compile(r"[0-9]{1,10}")


class Actor(Protocol):
    """What the webhook needs from the remediator (kept abstract so neither module imports
    the other)."""

    config: RemediationConfig

    @property
    def snap(self) -> Any: ...

    def act(self, event: Event, actions: tuple, *, trigger: str,
            context: dict[str, Any]) -> list: ...

    def audit_rejected(self, status: int, reason: str, peer: str | None) -> None: ...


class Alert(msgspec.Struct, kw_only=True, rename="camel"):
    status: str
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    starts_at: str = ""
    ends_at: str = ""
    fingerprint: str = ""


class Payload(msgspec.Struct, kw_only=True, rename="camel"):
    version: str
    status: str = ""
    receiver: str = ""
    group_key: str = ""
    alerts: list[Alert]


_decoder = msgspec.json.Decoder(Payload)


def _error(status: int, message: str, **headers: str) -> server.Response:
    return server.json_response({"status": "error", "error": message}, status=status,
                                headers=headers or None)


class AlertmanagerWebhook:
    def __init__(self, remediator: Actor, config: WebhookConfig, *, clock) -> None:
        self.remediator = remediator
        self.clock = clock
        self._seen: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.reconfigure(config)

    def reconfigure(self, config: WebhookConfig) -> None:
        self.config = config
        self._token = config.token.encode()
        self._routes = [
            (re.compile(r.alertname) if r.alertname else None, r.match,
             tuple(parse_action(a) for a in r.actions))
            for r in config.routes
        ]

    async def handle(self, request: server.Request) -> server.Response:
        try:
            resp = await self._handle(request)
        except Exception:
            log.exception("alertmanager webhook: unexpected error")
            resp = _error(500, "internal error (logged)")
        if resp.status >= 400:
            with contextlib.suppress(Exception):  # accounting must not turn a 4xx into a 500
                self.remediator.audit_rejected(resp.status, _reason_of(resp), request.remote)
        return resp

    async def _handle(self, request: server.Request) -> server.Response:
        if not self._token:
            return _error(404, "webhook disabled: set webhook.token (GPUWATCH_WEBHOOK_TOKEN)")
        if not self.remediator.config.enabled:
            return _error(404, "webhook disabled: remediation.enabled is false")
        if not self._authorized(request.headers.get("Authorization", "")):
            return _error(401, "missing or wrong bearer token",
                          **{"WWW-Authenticate": 'Bearer realm="gpuwatch"'})
        ctype = request.content_type
        if request.headers.get("Content-Type") and ctype != "application/json":
            return _error(415, f"expected application/json, got {ctype}")
        body = await self._read_limited(request)
        if body is None:
            return _error(413, f"body larger than {self.config.max_body_bytes} bytes")
        try:
            payload = _decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return _error(400, f"invalid Alertmanager payload: {exc}")
        except RecursionError:
            return _error(400, "invalid Alertmanager payload: nested too deeply")
        bad = _bad_labels(payload)
        if bad:
            return _error(400, f"invalid Alertmanager payload: {bad}")
        if payload.version != "4":
            return _error(400, f"unsupported payload version {payload.version!r} (expected '4')")
        if self.remediator.snap is None or getattr(self.remediator.snap, "tick", None) is None:
            # Alertmanager retries on 5xx: the first sample is seconds away.
            return _error(503, "no sample yet", **{"Retry-After": "5"})
        return server.json_response(await self.process(payload))

    def _authorized(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        # Compare even on a wrong scheme so the timing does not tell which part failed.
        # A header's non-UTF-8 bytes arrive as surrogates: compared as they came, never a 500.
        ok = hmac.compare_digest(token.strip().encode("utf-8", "surrogateescape"), self._token)
        return ok and scheme.lower() == "bearer"

    async def _read_limited(self, request: server.Request) -> bytes | None:
        return await request.read(self.config.max_body_bytes)

    async def process(self, payload: Payload) -> dict[str, Any]:
        now = self.clock()
        self._expire(now)
        actions: list[dict] = []
        ignored: list[dict] = []
        for i, alert in enumerate(payload.alerts):
            if i and i % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let scrapes in between decisions of a large batch
            name = alert.labels.get("alertname", "")
            fp = alert.fingerprint or _fingerprint(alert.labels)
            why = self._ignore_reason(alert, fp)
            if why:
                ignored.append({"alertname": name, "fingerprint": fp, "reason": why})
                continue
            route = self._route(alert)
            if route is None:
                ignored.append({"alertname": name, "fingerprint": fp, "reason": "no route"})
                continue
            event = _event_from(alert, now, self.remediator.snap)
            # An alert that names only a pod acts on that pod's GPU processes on this host.
            events = [event] if event is not None else _pod_events(alert, now,
                                                                   self.remediator.snap)
            if not events:
                labels = alert.labels
                why = (f"pod {labels.get('namespace')}/{labels['pod']} has no GPU process on "
                       "this host" if labels.get("pod") and labels.get("namespace") else
                       "labels name no uuid/gpu, pid, engine or namespace/pod")
                ignored.append({"alertname": name, "fingerprint": fp, "reason": why})
                continue
            if event is not None and event.gpu_uuid and event.gpu_uuid not in self._local_uuids():
                # One Alertmanager receiver fans out to every host: not ours to act on.
                ignored.append({"alertname": name, "fingerprint": fp,
                                "reason": f"GPU {event.gpu_uuid} is not on this host"})
                continue
            self._seen[(fp, alert.starts_at)] = now
            for event in events:
                decided = self.remediator.act(
                    event, route, trigger="alertmanager",
                    context={"alertname": name, "fingerprint": fp,
                             "receiver": payload.receiver},
                )
                started = len(route) - len(decided)
                actions += [msgspec.to_builtins(a) for a in decided]
                if started:
                    actions.append({"alertname": name, "fingerprint": fp, "started": started})
        return {"status": "ok", "actions": actions, "ignored": ignored}

    def _local_uuids(self) -> set[str]:
        tick = getattr(self.remediator.snap, "tick", None)
        return {g.uuid for g in getattr(tick, "gpus", ())}

    def _ignore_reason(self, alert: Alert, fp: str) -> str:
        if alert.status != "firing":
            return f"status {alert.status}"
        if (fp, alert.starts_at) in self._seen:
            return "duplicate"
        return ""

    def _route(self, alert: Alert) -> tuple | None:
        if not self._routes:
            return DEFAULT_ACTIONS
        name = alert.labels.get("alertname", "")
        for pattern, match, actions in self._routes:
            if pattern is not None and not pattern.fullmatch(name):
                continue
            if all(alert.labels.get(k) == v for k, v in match.items()):
                return actions
        return None

    def _expire(self, now: float) -> None:
        while self._seen:
            key, t = next(iter(self._seen.items()))
            if now - t < self.config.dedup_seconds and len(self._seen) <= DEDUP_MAX_ENTRIES:
                break
            del self._seen[key]


def _reason_of(resp: server.Response) -> str:
    try:
        return str(msgspec.json.decode(resp.body).get("error", ""))[:300]
    except (msgspec.DecodeError, AttributeError, TypeError):
        return ""


def _bad_labels(payload: Payload) -> str:
    """Why the payload's pid / gpu labels cannot be used, or "" when they can."""
    for i, alert in enumerate(payload.alerts):
        for key in ("pid", "gpu"):
            value = alert.labels.get(key, "")
            if value and not _ASCII_NUMBER.fullmatch(value):
                return f"alerts[{i}].labels.{key} = {value[:32]!r} is not an ASCII number"
    return ""


def _fingerprint(labels: dict[str, str]) -> str:
    text = "\xff".join(f"{k}\xff{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


MAX_POD_TARGETS = 16  # one alert never fans out to more processes than this


def _pod_events(alert: Alert, now: float, snap: Any) -> list[Event]:
    """The GPU processes of the pod an alert names (namespace and pod both required: a pod
    name alone is not unique), as events the same guardrails then judge one by one."""
    labels = alert.labels
    ns, pod = labels.get("namespace"), labels.get("pod")
    if not ns or not pod:
        return []
    procs = [(g.uuid, p) for g in getattr(getattr(snap, "tick", None), "gpus", ())
             if not g.lost for p in g.processes if p.namespace == ns and p.pod == pod]
    return [Event(t=now, signal=labels.get("signal") or labels.get("alertname", "alert"),
                  state="firing", severity=labels.get("severity", "warning"), gpu_uuid=uuid,
                  pid=p.pid, namespace=ns, pod=pod, container=p.container or None,
                  message=alert.annotations.get("summary", ""))
            for uuid, p in procs[:MAX_POD_TARGETS]]


def _event_from(alert: Alert, now: float, snap: Any) -> Event | None:
    labels = alert.labels
    uuid = labels.get("uuid") or None
    if uuid is None and labels.get("gpu"):
        tick = getattr(snap, "tick", None)
        index = int(labels["gpu"])
        uuid = next((g.uuid for g in getattr(tick, "gpus", ()) if g.index == index), None)
    pid = int(labels["pid"]) if labels.get("pid") else None
    engine = labels.get("engine") or None
    if uuid is None and pid is None and engine is None:
        return None
    value = None
    with contextlib.suppress(ValueError, KeyError):
        value = float(alert.annotations["value"])
    return Event(
        t=now, signal=labels.get("signal") or labels.get("alertname", "alert"),
        state="firing", severity=labels.get("severity", "warning"), gpu_uuid=uuid, pid=pid,
        engine=engine, value=value,
        message=alert.annotations.get("summary") or alert.annotations.get("description", ""),
    )
