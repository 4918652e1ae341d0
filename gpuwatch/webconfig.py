"""TLS, client certificates and basic auth for every endpoint, from a web configuration file in
the Prometheus exporter-toolkit format (the file node_exporter and most exporters take with
`--web.config.file`), so one file serves the whole fleet of exporters:

    tls_server_config:
      cert_file: server.crt            # relative paths: against this file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: clients-ca.crt
      min_version: TLS12
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2b$12$...           # bcrypt hash (htpasswd -nBC 12 "" | tr -d ':\\n')

Every problem is one line naming the key; the daemon exits with status 2 before serving.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import math
import os
import re
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from gpuwatch import admission
from gpuwatch.config import WebConfigError
from gpuwatch.exporter import server
from gpuwatch.tomlfile import explain, read_regular

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1024 * 1024
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
# Go's TLS can ask for a certificate and not verify it; Python's ssl verifies every certificate
# it asks for, so these two would silently mean something else.
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
UNSUPPORTED_TLS_KEYS = ("cipher_suites", "curve_preferences", "prefer_server_cipher_suites",
                        "client_allowed_sans", "cert", "key", "client_ca")
_BCRYPT_HASH = re.compile(rb"\$2[aby]?\$\d\d\$[./A-Za-z0-9]{53}")
_BCRYPT_COST = re.compile(rb"\$2[aby]?\$(\d\d)\$")
# Checked for unknown users, so that a wrong name costs as long as a wrong password: at the
# cost of the dearest configured hash (dummy_hash), else a cheap unknown name would tell.
_DUMMY_HASH = b"$2b$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


def dummy_hash(users: dict[str, bytes]) -> bytes:
    """_DUMMY_HASH with the highest cost among the users' hashes ($2b$CC$...)."""
    costs = [int(m.group(1)) for h in users.values() if (m := _BCRYPT_COST.match(h))]
    cost = max(costs, default=int(_DUMMY_HASH[4:6]))
    return b"$2b$%02d$" % cost + _DUMMY_HASH[7:]
AUTH_CACHE_ENTRIES = 256
# bcrypt runs on threads, at most this many at once and never on more than half the cores:
# a flood of wrong passwords costs CPU time, never the event loop or every core. At cost 12
# one check is ~0.3-0.8 s on a small VM, so a waiter at the back of the queue waits a few
# seconds at most, inside a scrape timeout.
BCRYPT_CONCURRENCY = max(1, min(2, len(os.sched_getaffinity(0)) // 2))
BCRYPT_QUEUE = 8
# Failed logins per client address (IPv6: per /64) before it is answered 429 unchecked.
AUTH_FAILURE_BURST = 10
AUTH_FAILURES_PER_MINUTE = 10


class _TLS(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    cert_file: str = ""
    key_file: str = ""
    client_auth_type: str = ""
    client_ca_file: str = ""
    min_version: str = ""
    max_version: str = ""


class _HTTP(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    http2: bool = True  # accepted for compatibility: gpuwatch serves HTTP/1.1
    headers: dict[str, str] = {}


class _File(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    tls_server_config: _TLS | None = None
    http_server_config: _HTTP | None = None
    basic_auth_users: dict[str, str] = {}


@dataclass(frozen=True)
class TLSSettings:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = ""


@dataclass(frozen=True)
class WebConfig:
    path: Path
    tls: TLSSettings | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


def load(path: str | Path) -> WebConfig:
    """Read and validate the file, including that its certificates and key load. Raises
    WebConfigError."""
    path = Path(path)

    def fail(key: str, reason: str) -> WebConfigError:
        return WebConfigError(f"web config {path}: {key + ': ' if key else ''}{reason}")

    raw = _read_yaml(path, fail)
    if isinstance(raw, dict) and isinstance(raw.get("tls_server_config"), dict):
        for key in UNSUPPORTED_TLS_KEYS:
            if key in raw["tls_server_config"]:
                raise fail(f"tls_server_config.{key}", "not supported by gpuwatch "
                           "(it uses OpenSSL's defaults; give cert_file/key_file/client_ca_file)")
    try:
        doc = msgspec.convert(raw if raw is not None else {}, _File)
    except msgspec.ValidationError as exc:
        key, reason = explain(exc)
        raise fail(key, reason) from None
    base = path.parent
    tls = _tls(doc.tls_server_config, base, fail) if doc.tls_server_config else None
    users = _users(doc.basic_auth_users, fail)
    headers = dict(doc.http_server_config.headers) if doc.http_server_config else {}
    for name, value in headers.items():
        if not re.fullmatch(r"[A-Za-z0-9-]+", name) or "\r" in value or "\n" in value:
            raise fail(f"http_server_config.headers.{name}", "not a valid header")
    wc = WebConfig(path=path, tls=tls, users=users, headers=headers)
    ssl_context(wc)  # certificate and key problems are startup errors, not handshake failures
    return wc


def _read_yaml(path: Path, fail: Callable[[str, str], WebConfigError]) -> object:
    import yaml  # only a host with a web configuration file reads YAML

    try:  # a FIFO or a device is refused before anything is read: a reload never blocks
        data = read_regular(path, MAX_FILE_BYTES)
    except OSError as exc:
        raise fail("", exc.strerror or str(exc)) from None
    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise fail("", f"invalid YAML{where}: {problem}") from None


def _tls(t: _TLS, base: Path, fail: Callable[[str, str], WebConfigError]) -> TLSSettings:
    where = "tls_server_config"
    if not t.cert_file:
        raise fail(f"{where}.cert_file", "required with tls_server_config")
    if not t.key_file:
        raise fail(f"{where}.key_file", "required with tls_server_config")
    auth = t.client_auth_type or "NoClientCert"
    if auth in UNSUPPORTED_CLIENT_AUTH:
        raise fail(f"{where}.client_auth_type", f"{auth} is not supported (client "
                   "certificates are always verified): use VerifyClientCertIfGiven or "
                   "RequireAndVerifyClientCert")
    if auth not in CLIENT_AUTH:
        raise fail(f"{where}.client_auth_type",
                   f"{auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    if t.client_ca_file and auth == "NoClientCert":
        raise fail(f"{where}.client_ca_file",
                   "given without a client_auth_type that verifies client certificates")
    if auth != "NoClientCert" and not t.client_ca_file:
        raise fail(f"{where}.client_ca_file", f"required with client_auth_type {auth}")
    for key in ("min_version", "max_version"):
        value = getattr(t, key)
        if value and value not in TLS_VERSIONS:
            raise fail(f"{where}.{key}", f"{value!r} is not one of {', '.join(TLS_VERSIONS)}")
    lo, hi = t.min_version or "TLS12", t.max_version
    if hi and TLS_VERSIONS[hi] < TLS_VERSIONS[lo]:
        raise fail(f"{where}.max_version", f"{hi} is below min_version {lo}")
    return TLSSettings(cert_file=base / t.cert_file, key_file=base / t.key_file,
                       client_auth_type=auth,
                       client_ca_file=base / t.client_ca_file if t.client_ca_file else None,
                       min_version=lo, max_version=hi)


def _users(raw: dict[str, str], fail: Callable[[str, str], WebConfigError]) -> dict[str, bytes]:
    users = {}
    for name, hashed in raw.items():
        if not name or ":" in name:
            raise fail("basic_auth_users", f"{name!r} is not a valid user name")
        value = hashed.strip().encode()
        if not _BCRYPT_HASH.fullmatch(value):
            # The hash itself is not repeated: a plain password put here by mistake stays out
            # of the log.
            raise fail(f"basic_auth_users.{name}", "not a bcrypt hash (htpasswd -nBC 12)")
        users[name] = value
    return users


def ssl_context(wc: WebConfig) -> ssl.SSLContext | None:
    """The server context, or None without TLS. Raises WebConfigError."""
    t = wc.tls
    if t is None:
        return None
    where = f"web config {wc.path}: tls_server_config"
    for key in ("cert_file", "key_file", "client_ca_file"):
        file = getattr(t, key)
        if file is not None and not file.is_file():
            # OpenSSL would block on a FIFO, and a reload with it.
            why = "not a regular file" if file.exists() else "file not found"
            raise WebConfigError(f"{where}.{key}: {file}: {why}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[t.min_version]
    if t.max_version:
        ctx.maximum_version = TLS_VERSIONS[t.max_version]
    try:
        ctx.load_cert_chain(t.cert_file, t.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(f"{where}.cert_file/key_file: cannot load the certificate and "
                             f"key ({_ssl_reason(exc)})") from None
    ctx.verify_mode = CLIENT_AUTH[t.client_auth_type]
    if t.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=t.client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(f"{where}.client_ca_file: cannot load ({_ssl_reason(exc)})"
                                 ) from None
    return ctx


def _ssl_reason(exc: Exception) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes. Successful verdicts are cached by a
    digest of (user, password, hash), so a scraper pays bcrypt's cost once, not per scrape;
    failures have a cache of their own, so no number of wrong or unknown credentials evicts a
    right one. The user name is compared in constant time and an unknown one costs a bcrypt
    check too. bcrypt runs on its own threads, BCRYPT_CONCURRENCY at once, with at most
    BCRYPT_QUEUE callers waiting: past that a check is refused at once (Busy)."""

    def __init__(self, users: dict[str, bytes],
                 workers: admission.BoundedWorkers | None = None) -> None:
        self.users = dict(users)
        self._dummy = dummy_hash(self.users)
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._failed: OrderedDict[bytes, None] = OrderedDict()
        self.workers = workers or admission.BoundedWorkers(
            BCRYPT_CONCURRENCY, BCRYPT_QUEUE, "bcrypt")

    async def check(self, header: str) -> bool:
        try:
            return await self.verify(header)
        except admission.Busy:
            return False

    async def verify(self, header: str, *, clean: bool = True, client: str = "") -> bool:
        """True for a right credential; raises admission.Busy when bcrypt's queue is full
        (clean: the caller's client has no failed login on record, and waits ahead of those
        that have)."""
        found = self._key(header)
        if found is None:
            return False
        key, known, password, hashed = found
        if key in self._ok:
            self._ok.move_to_end(key)
            return known
        if key in self._failed:
            self._failed.move_to_end(key)
            return False
        ok = await self.workers.run(_checkpw, password, hashed, clean=clean, client=client)
        cache = self._ok if ok and known else self._failed
        cache[key] = None
        while len(cache) > AUTH_CACHE_ENTRIES:
            cache.popitem(last=False)
        return ok and known

    def cached(self, header: str) -> bool:
        """Whether this header is a credential already found right: a digest, no bcrypt."""
        found = self._key(header)
        return found is not None and found[0] in self._ok

    def _key(self, header: str) -> tuple[bytes, bool, bytes, bytes] | None:
        creds = _parse_basic(header)
        if creds is None:
            return None
        user, password = creds[0].encode(), creds[1].encode()
        hashed, known = self._dummy, False
        for name, h in self.users.items():
            if hmac.compare_digest(name.encode(), user):
                hashed, known = h, True
        key = hashlib.sha256(b"\0".join((user, password, hashed))).digest()
        return key, known, password, hashed


def _checkpw(password: bytes, hashed: bytes) -> bool:
    import bcrypt  # only hosts that configure basic auth pay for it

    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:
        return False


def _parse_basic(header: str) -> tuple[str, str] | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or len(value) > 4096:
        return None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(
            ":")
    except ValueError:  # not base64 (binascii.Error), not ASCII, or not UTF-8 inside
        return None
    return (user, password) if sep else None


Handler = Callable[[server.Request], Awaitable[server.Response]]


class Guard:
    """Basic auth and the configured headers on every route, present and future, as a
    middleware; TLS is the listening site's context. Paths in bearer_paths (the Alertmanager
    webhook) may instead carry a bearer token, which their handler checks: Alertmanager sends
    one credential, not two. update() takes a reloaded file (SIGHUP): users, headers, and a
    rotated certificate and key.

    A client past its budget of failed logins gets 429 without a bcrypt check (unless its
    credential is one already found right), and one that finds bcrypt's queue full gets 503,
    both at once; every refusal closes the connection."""

    def __init__(self, wc: WebConfig, bearer_paths: Iterable[str] = (), *,
                 failures_per_minute: float = AUTH_FAILURES_PER_MINUTE) -> None:
        self.bearer = frozenset(bearer_paths)
        self.wc = wc
        # One bcrypt queue for the daemon's life: a reload does not reset who waits.
        self.workers = admission.BoundedWorkers(BCRYPT_CONCURRENCY, BCRYPT_QUEUE, "bcrypt")
        self.auth = BasicAuth(wc.users, self.workers) if wc.users else None
        self.context = ssl_context(wc)
        self.budget = admission.FailureBudget(failures_per_minute, AUTH_FAILURE_BURST)
        self.refused: dict[str, int] = {"unauthorized": 0, "rate_limited": 0, "busy": 0}
        self.refused_by: dict[str, int] = {}  # client -> refusals since take_refusals()

    def check_update(self, wc: WebConfig) -> None:
        """Raises WebConfigError when a reload would weaken what is served without anyone
        saying so: basic auth cannot be turned off by emptying basic_auth_users on SIGHUP
        (restart with the new file to serve without it)."""
        if self.wc.users and not wc.users:
            raise WebConfigError(f"web config {wc.path}: basic_auth_users: empty, which would "
                                 "turn basic auth off; refused on reload (restart gpuwatch "
                                 "with this file to serve without basic auth)")

    def update(self, wc: WebConfig, context: ssl.SSLContext | None = None) -> list[str]:
        """Take what can change while serving; returns what needs a restart instead. context:
        ssl_context(wc) made beforehand (off the event loop), to serve new connections with
        instead of loading the new certificate into the current one."""
        self.check_update(wc)
        old = self.wc.tls
        new = wc.tls
        restart = []
        if (old is None) != (new is None) or (old and new and (
                old.client_auth_type, old.client_ca_file, old.min_version, old.max_version) != (
                new.client_auth_type, new.client_ca_file, new.min_version, new.max_version)):
            restart.append("tls_server_config (other than cert_file/key_file)")
        elif new is not None and self.context is not None:
            # New connections get the new certificate; open ones keep theirs.
            if context is not None:
                self.context = context
            else:
                self.context.load_cert_chain(new.cert_file, new.key_file)
        self.wc = wc
        self.auth = BasicAuth(wc.users, self.workers) if wc.users else None
        return restart

    def close(self) -> None:
        self.workers.close()

    def take_refusals(self) -> dict[str, int]:
        """Refusals per client since the last call (the rate-limited log line's detail)."""
        out, self.refused_by = self.refused_by, {}
        return out

    def _refuse(self, client: str, reason: str, status: int, text: str,
                headers: dict[str, str]) -> server.Response:
        self.refused[reason] += 1
        if len(self.refused_by) < 1000 or client in self.refused_by:
            self.refused_by[client] = self.refused_by.get(client, 0) + 1
        # A refused client keeps no connection open.
        return server.Response(text, status, {**headers, **self.wc.headers,
                                              "Connection": "close"})

    async def middleware(self, request: server.Request, handler: Handler) -> server.Response:
        auth, extra = self.auth, self.wc.headers
        header = request.headers.get("Authorization", "")
        if auth is not None and not (
                request.path in self.bearer and header[:7].lower() == "bearer "):
            client = admission.client_key(request.remote)
            wait = self.budget.retry_after(client)
            if wait and not auth.cached(header):
                return self._refuse(client, "rate_limited", 429,
                                    "429 Too Many Requests: too many failed logins from this "
                                    "address\n", {"Retry-After": str(math.ceil(wait))})
            try:
                ok = await auth.verify(header, clean=self.budget.clean(client), client=client)
            except admission.Busy:
                return self._refuse(client, "busy", 503, "503 Service Unavailable: too many "
                                    "logins being checked\n", {"Retry-After": "1"})
            if not ok:
                self.budget.failed(client)
                self.workers.demote(client)
                return self._refuse(client, "unauthorized", 401,
                                    "401 Unauthorized: basic auth required\n",
                                    {"WWW-Authenticate": 'Basic realm="gpuwatch"'})
        response = await handler(request)
        response.headers.update(extra)
        return response
