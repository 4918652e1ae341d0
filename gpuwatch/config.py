"""One validated configuration model: defaults, then a TOML file, then GPUWATCH_* variables,
then command-line flags. Every error names the key and the reason."""

from __future__ import annotations

import logging
import os
import re
from typing import Annotated, Any

import msgspec

from gpuwatch.attribution.config import AttributionConfig
from gpuwatch.engines.config import DiscoveryConfig, EngineConfig
from gpuwatch.nodehealth.config import NvSentinelConfig
from gpuwatch.otlp.config import OtlpConfig
from gpuwatch.probe_channel.config import ProbeConfig
from gpuwatch.redact import config_for_display
from gpuwatch.remediation.config import RemediationConfig, WebhookConfig
from gpuwatch.signals.budget import BudgetConfig
from gpuwatch.signals.config import SignalsConfig
from gpuwatch.tomlfile import explain, read_toml

DEFAULT_PORT = 19400
ENV_PREFIX = "GPUWATCH_"
# What kubelet injects for a Service named gpuwatch-*; never a setting.
_K8S_SERVICE_LINK = re.compile(
    r"_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$")
log = logging.getLogger(__name__)

PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]


class ConfigError(ValueError):
    """A configuration problem; the message names the key and the reason."""


class WebConfigError(ValueError):
    """A web configuration problem (gpuwatch.webconfig); the message is one line naming the
    file and the key. Here, not beside the reader, so the daemon can catch it without loading
    TLS and basic auth where no web configuration file is given."""


class NvmlConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    fast_interval_seconds: PositiveFloat = 2.0
    # Energy and PCIe throughput (PCIe costs ~20 ms per call): 0 turns the slow tier off.
    slow_interval_seconds: NonNegFloat = 30.0
    xid_events: bool = True
    retry_max_seconds: PositiveFloat = 60.0
    # Only these GPU indices (empty: all).
    gpus: list[int] = []


class ThresholdsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # An override table that names its own version and the base it extends.
    file: str = ""


PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class HttpConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # /api/state shows process names, pids and the (masked) configuration; off: 404.
    api_state: bool = True
    # What a remote party may hold open (docs/security.md, "Connections"): connections in
    # all and per client address (IPv6: per /64). Lowered to fit the descriptor limit.
    max_connections: PositiveInt = 512
    max_connections_per_client: PositiveInt = 64
    # The TLS handshake and the first request's headers must arrive within this.
    header_timeout_seconds: PositiveFloat = 10.0
    # An idle keep-alive connection is closed after this (above a 60 s scrape interval).
    idle_timeout_seconds: PositiveFloat = 75.0
    # A response the client does not read is dropped after this.
    write_timeout_seconds: PositiveFloat = 30.0
    # Failed basic-auth logins per client address and minute, after a burst of 10; past it
    # the address gets 429 without a check (0: no limit).
    auth_failures_per_minute: NonNegFloat = 10.0


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    listen: str = f":{DEFAULT_PORT}"
    # TLS, client certificates and basic auth, in the Prometheus exporter-toolkit format.
    web_config: str = ""
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    log_level: str = "info"
    record: str = ""
    simulate: str = ""
    seed: int = 0
    # This host's name where gpuwatch names it (recordings, OTLP's host.name); "" the
    # system's. A simulated fleet on one machine gives each daemon its own.
    host_name: str = ""
    # Simulated process name -> a real pid whose identity it takes (remediation tests).
    simulate_pids: dict[str, int] = {}
    events_log: str = ""
    # Not ready while no GPU is sampled: a DaemonSet on GPU nodes should not count a pod whose
    # NVML is down as ready. Without it, ready means every source was tried once.
    require_gpu: bool = False
    nvml: NvmlConfig = msgspec.field(default_factory=NvmlConfig)
    engines: list[EngineConfig] = []
    discovery: DiscoveryConfig = msgspec.field(default_factory=DiscoveryConfig)
    signals: SignalsConfig = msgspec.field(default_factory=SignalsConfig)
    thresholds: ThresholdsConfig = msgspec.field(default_factory=ThresholdsConfig)
    probe: ProbeConfig = msgspec.field(default_factory=ProbeConfig)
    remediation: RemediationConfig = msgspec.field(default_factory=RemediationConfig)
    webhook: WebhookConfig = msgspec.field(default_factory=WebhookConfig)
    # The /proc tree to read processes from (a container may mount the host's elsewhere).
    proc_root: str = "/proc"
    attribution: AttributionConfig = msgspec.field(default_factory=AttributionConfig)
    # Per-process series only for the processes that matter (signals/budget.py).
    budget: BudgetConfig = msgspec.field(default_factory=BudgetConfig)
    # OTLP push (optional, docs/fleet.md): off while otlp.endpoint is empty.
    otlp: OtlpConfig = msgspec.field(default_factory=OtlpConfig)
    nvsentinel: NvSentinelConfig = msgspec.field(default_factory=NvSentinelConfig)

    def __post_init__(self) -> None:
        parse_listen(self.listen)
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError("log_level: must be one of debug, info, warning, error")
        names = [e.name for e in self.engines]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"engines: duplicate engine name(s) {', '.join(dupes)}")


def parse_listen(value: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or '[v6]:PORT' -> (host, port); host '' means all interfaces."""
    m = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d+)", value)
    if not m:
        raise ValueError(f"listen: {_listen_problem(value)}")
    if not 0 <= int(m["port"]) <= 65535:
        raise ValueError(f"listen: port {m['port']} is out of range (0-65535) in {value!r}")
    return (m["v6"] or m["host"] or ""), int(m["port"])


def _listen_problem(value: str) -> str:
    """Why a listen address does not parse, with the spelling that would."""
    if value.isdigit():
        return (f"{value!r} has no host: write ':{value}' for all interfaces or "
                f"'127.0.0.1:{value}' for this host only")
    if value.count(":") > 1 and not value.startswith("["):
        return f"{value!r}: an IPv6 address goes in brackets, as in '[::1]:{DEFAULT_PORT}'"
    if ":" not in value or value.endswith("]"):
        return f"{value!r} has no port: write HOST:PORT, as in '{value}:{DEFAULT_PORT}'"
    port = value.rsplit(":", 1)[1]
    if not port:
        return f"{value!r} has no port after ':'"
    return f"port {port!r} in {value!r} is not a number (HOST:PORT, ':PORT' or '[v6]:PORT')"


def _convert(raw: dict[str, Any], source: str) -> Config:
    try:
        return msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        key, reason = explain(exc)
        raise ConfigError(f"{source}: {key + ': ' if key else ''}{reason}") from None


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _field_types(struct: type) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(struct)}


def _env_to_dict(environ: dict[str, str]) -> dict[str, Any]:
    """GPUWATCH_WEBHOOK_TOKEN -> {'webhook': {'token': ...}}: the first section name that
    prefixes the rest wins, so keys with underscores (nvml.fast_interval_seconds) work."""
    out: dict[str, Any] = {}
    for name, value in environ.items():
        # GPUWATCH_EVENT_*: what an exec hook receives; GPUWATCH_TEST_*: the test suite's own
        # (its server cache), exported by developers in the shell the daemon runs from.
        if (not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG"
                or name.startswith((ENV_PREFIX + "EVENT_", ENV_PREFIX + "TEST_"))):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        path = _resolve_env_path(Config, rest)
        if path is None:
            # A typo inside a known setting is an error. Other GPUWATCH_* names belong to
            # someone else: Kubernetes service links (GPUWATCH_SERVICE_HOST,
            # GPUWATCH_PORT_9400_TCP) or test harnesses, and must not stop the daemon.
            if _names_a_setting(Config, rest) and not _K8S_SERVICE_LINK.search(name):
                raise ConfigError(f"environment: {name}: unknown setting")
            log.warning("environment: %s: not a gpuwatch setting, ignored", name)
            continue
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = _env_value(value)
    return out


def _names_a_setting(struct: type, rest: str) -> bool:
    return any(rest == f or rest.startswith(f + "_") for f in _field_types(struct))


def _resolve_env_path(struct: type, rest: str) -> list[str] | None:
    fields = _field_types(struct)
    if rest in fields:
        return [rest]
    for fname, ftype in fields.items():
        if rest.startswith(fname + "_") and isinstance(ftype, type) and issubclass(
            ftype, msgspec.Struct
        ):
            sub = _resolve_env_path(ftype, rest[len(fname) + 1:])
            if sub is not None:
                return [fname, *sub]
    return None


def _env_value(value: str) -> Any:
    """Environment values are strings; lists may be given comma-separated."""
    return value


def load(
    path: str | os.PathLike | None = None,
    environ: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Config:
    """Defaults < file < environment < flags. Raises ConfigError."""
    environ = dict(os.environ) if environ is None else environ
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is None and environ.get(ENV_PREFIX + "CONFIG"):
        path = environ[ENV_PREFIX + "CONFIG"]
    if path:
        source = str(path)
        raw = read_toml(path, ConfigError)
        _convert(raw, source)  # report file errors against the file
    env = _env_to_dict(environ)
    if env:
        raw = _deep_merge(raw, env)
        source = f"{source} + environment" if path else "environment"
    if overrides:
        raw = _deep_merge(raw, {k: v for k, v in overrides.items() if v is not None})
        source = f"{source} + flags"
    return _convert(raw, source)


def to_dict(config: Config) -> dict[str, Any]:
    """Plain data for /api/state, with secrets masked."""
    return config_for_display(config)
