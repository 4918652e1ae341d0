"""Events: a signal changing state, or a remediation action (DESIGN.md §2)."""

from __future__ import annotations

import msgspec

from gpuwatch.safetext import encode_json

try:  # hashlib's own blake2b; hashlib itself would load OpenSSL's libcrypto (3 MiB) for it
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - a Python built without it
    from hashlib import blake2b

SIGNALS = (
    "memory_leak",
    "memory_zone",
    "time_to_oom",
    "fragmentation",
    "kv_cache_hit_ratio",
    "queue_latency",
    "engine_down",
    "gpu_lost",
    "process_oom",
)


class OomInfo(msgspec.Struct, omit_defaults=True, kw_only=True, frozen=True):
    """What a process_oom event says of the OOM (value: the request, threshold: the free
    memory), and of the event that predicted it (the event's ref)."""

    request_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    fragmentation_ratio: float | None = None
    cause: str = ""  # full | fragmentation | limit
    outcome: str = ""  # raised | caught | recovered | unknown
    exited: bool = False
    record: str = ""  # the record in the snapshot directory
    history: str = ""  # its allocation-history pickle (pytorch.org/memory_viz)
    predicted_by: str = ""  # memory_leak | time_to_oom (the ref), "" when nothing did
    lead_seconds: float | None = None  # how long before the OOM that event fired
    warned_by: str = ""  # memory_zone, when only the zone preceded it


class Event(msgspec.Struct, omit_defaults=True, kw_only=True, frozen=True):
    """Immutable once built: the log, /api/state and replay all hold the same objects, so
    nothing may rewrite one after it was published. A resolve is a new event whose `ref`
    is the `id` of the firing event it ends (an escalation's `ref` is the event it
    supersedes)."""

    id: str = ""
    ref: str | None = None
    t: float
    signal: str
    state: str  # firing | resolved
    severity: str = "warning"  # warning | critical
    gpu_uuid: str | None = None
    pid: int | None = None
    engine: str | None = None
    value: float | None = None
    threshold: float | None = None
    message: str = ""
    # Who runs the process (gpuwatch.attribution), when known.
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    slurm_job_id: str | None = None
    # process_oom only
    oom: OomInfo | None = None

    @property
    def key(self) -> tuple:
        """Identity of the condition this event is about (what 'resolved' refers to)."""
        return (self.signal, self.gpu_uuid, self.pid, self.engine)

    def published(self, ref: str | None = None) -> Event:
        """This event with its id (and ref) set, as it is published. The id is a digest of
        what the event says, so a live run and the replay of its recording agree."""
        text = repr((self.t, self.signal, self.state, self.severity, self.gpu_uuid, self.pid,
                     self.engine, ref))
        digest = blake2b(text.encode(), digest_size=8).hexdigest()
        return msgspec.structs.replace(self, id=digest, ref=ref)


class ActionEvent(msgspec.Struct, omit_defaults=True, kw_only=True):
    t: float
    action: str  # flush | snapshot | signal | exec
    target: str
    result: str  # ok | failed | dry_run | skipped_cooldown | skipped_rate_limit | refused
    reason: str = ""
    trigger: str = ""  # policy | alertmanager
    detail: dict = {}


_encoder = msgspec.json.Encoder()


def as_dict(ev: Event | ActionEvent) -> dict:
    """Plain data, unknown fields omitted, but every event with its severity (DESIGN.md: a
    warning is the default, which omit_defaults would leave out)."""
    d = msgspec.to_builtins(ev)
    if isinstance(ev, Event) and "severity" not in d:
        d = {k: d[k] if k != "severity" else ev.severity for k in ev.__struct_fields__
             if k in d or k == "severity"}
    return d


def to_json(ev: Event | ActionEvent) -> str:
    return encode_json(_encoder, as_dict(ev)).decode()
