"""Web authentication and TLS (webconfig.py) with real clients and real requests: each guard
meets the request or the file it is there to refuse. A real daemon serves TLS 1.3 only with
basic auth; the daemon's own HTTP server, with its Guard middleware and TLS context, meets
what only shows with another layer taken away (the webhook's own token check, the dummy
hash's unknown password), and those tests say so."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings

import bcrypt
import pytest
import yaml

from gpuwatch import webconfig
from gpuwatch.exporter import server
from gpuwatch.webconfig import Guard, WebConfigError
from tests.helpers import Daemon, child_env, wait_until
from tests.tls_certs import CA

USER, PASSWORD = "prometheus", "scrape-pass-0b7e"
HEADERS = {"Strict-Transport-Security": "max-age=31536000", "X-Content-Type-Options": "nosniff"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("bite-pki")
    ca = CA(d, "ca")
    ca.issue("server", server=True)
    return {"dir": d, "ca": ca.crt,
            "hash": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}


def write(pki, doc: dict, name: str | None = None):
    path = pki["dir"] / (name or f"web-{time.monotonic_ns()}.yml")
    path.write_text(yaml.safe_dump(doc))
    return path


def tls(**extra) -> dict:
    return {"cert_file": "server.crt", "key_file": "server.key", **extra}


def basic(user: str, password: str, scheme: str = "Basic") -> str:
    return f"{scheme} " + base64.b64encode(f"{user}:{password}".encode()).decode()


def client_context(pki, version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    """A client that trusts the test CA; `version`: it offers that TLS version only."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(pki["ca"])
    if version is not None:
        with warnings.catch_warnings():  # TLS 1.0/1.1 are deprecated: that is the point
            warnings.simplefilter("ignore", DeprecationWarning)
            ctx.minimum_version = ctx.maximum_version = version
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client offer what it is asked to
    return ctx


def handshake(port: int, ctx: ssl.SSLContext) -> str:
    """The TLS version the server agreed to; ssl.SSLError when it refused."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock, \
            ctx.wrap_socket(sock, server_hostname="127.0.0.1") as conn:
        return conn.version()


def request(port: int, ctx: ssl.SSLContext, path: str, method: str = "GET",
            headers: dict | None = None, body: bytes | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


# -- what the file may say ----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["max-age=1\r\nSet-Cookie: s=1", "a\nb", "a\rb"])
def test_a_configured_header_value_with_cr_or_lf_is_refused_at_load(pki, value):
    """The HTTP layer refuses to send such a header, so every response would fail: the file
    is refused before anything is served, naming the header."""
    path = write(pki, {"http_server_config": {"headers": {"Strict-Transport-Security": value}}})
    with pytest.raises(WebConfigError, match=r"headers\.Strict-Transport-Security: not a valid"):
        webconfig.load(path)


@pytest.mark.parametrize("name", ["X Frame", "X:Frame", "X-Frame\r\nSet-Cookie", "", "Ünicode"])
def test_a_header_name_that_is_no_token_is_refused_at_load(pki, name):
    path = write(pki, {"http_server_config": {"headers": {name: "1"}}})
    with pytest.raises(WebConfigError, match="not a valid header"):
        webconfig.load(path)


@pytest.mark.parametrize("doc", [
    {"tls_server_config": {**tls(), "min_versoin": "TLS13"}},
    {"http_server_config": {"header": {"X-Frame-Options": "DENY"}}},
], ids=["tls_server_config", "http_server_config"])
def test_a_misspelt_key_is_refused_not_ignored(pki, doc):
    """A misspelt min_version would leave TLS 1.2 on; a misspelt headers, no headers."""
    with pytest.raises(WebConfigError, match="unknown key"):
        webconfig.load(write(pki, doc))


def test_a_user_name_with_a_colon_is_refused_at_load(pki):
    """Basic auth splits at the first colon: `ops:team` could never log in."""
    path = write(pki, {"basic_auth_users": {"ops:team": pki["hash"]}})
    with pytest.raises(WebConfigError, match="'ops:team' is not a valid user name"):
        webconfig.load(path)


def test_a_web_config_over_the_size_cap_is_refused(pki):
    """A valid file padded past the cap with a comment: refused, not read in part."""
    path = pki["dir"] / "huge.yml"
    good = yaml.safe_dump({"basic_auth_users": {USER: pki["hash"]}})
    path.write_text(good + "#" + "x" * (webconfig.MAX_FILE_BYTES + 10) + "\n")
    assert webconfig.load(write(pki, {"basic_auth_users": {USER: pki["hash"]}})).users
    with pytest.raises(WebConfigError, match=f"larger than {webconfig.MAX_FILE_BYTES} bytes"):
        webconfig.load(path)


def test_the_daemon_exits_2_on_a_header_with_crlf(pki, tmp_path):
    path = write(pki, {"http_server_config": {"headers": {"X-Frame-Options": "DENY\r\nX: y"}}})
    r = subprocess.run([sys.executable, "-m", "gpuwatch", "run", "--simulate", "steady",
                        "--listen", "127.0.0.1:0", "--web-config", str(path)],
                       capture_output=True, text=True, env=child_env(), timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and "headers.X-Frame-Options: not a valid header" in r.stderr


def test_the_verdict_cache_keeps_exactly_its_size(pki, monkeypatch):
    """AUTH_CACHE_ENTRIES credentials are remembered (a scraper pays bcrypt once); one more
    pushes the oldest out, which then costs bcrypt again."""
    calls = []
    real = webconfig._checkpw
    monkeypatch.setattr(webconfig, "_checkpw", lambda p, h: calls.append(p) or real(p, h))
    auth = webconfig.BasicAuth({USER: pki["hash"].encode()})
    n = webconfig.AUTH_CACHE_ENTRIES

    async def go(count: int) -> int:
        for i in range(count):
            await auth.check(basic(USER, f"wrong-{i}"))
        before = len(calls)
        await auth.check(basic(USER, "wrong-0"))
        return len(calls) - before
    assert asyncio.run(go(n)) == 0  # still cached
    auth = webconfig.BasicAuth({USER: pki["hash"].encode()})
    assert asyncio.run(go(n + 1)) == 1  # pushed out by the one more


# -- a real daemon: TLS 1.3 only, basic auth -------------------------------------------------

@pytest.fixture(scope="module")
def daemon13(pki, tmp_path_factory):
    path = write(pki, {"tls_server_config": tls(min_version="TLS13"),
                       "http_server_config": {"headers": HEADERS},
                       "basic_auth_users": {USER: pki["hash"]}}, "daemon13.yml")
    work = tmp_path_factory.mktemp("bite-daemon")
    # No failed-login limit: these tests send many wrong logins from one address, and ask
    # the auth check itself, not the limiter in front of it (429 unchecked).
    d = Daemon(work, "--simulate", "steady", "--web-config", str(path),
               env={"GPUWATCH_WEBHOOK_TOKEN": "hook-token-2d9a",
                    "GPUWATCH_HTTP_AUTH_FAILURES_PER_MINUTE": "0"}, wait_ready=False)
    ctx = client_context(pki)
    auth = {"Authorization": basic(USER, PASSWORD)}

    def ready():
        if not d.alive():
            raise RuntimeError(d.output())
        return request(d.port, ctx, "/readyz", headers=auth)[0] == 200
    try:
        wait_until(ready, 60, what="the daemon over TLS")
        yield d
    finally:
        d.stop()


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_2],
                         ids=["TLS 1.1", "TLS 1.2"])
def test_min_version_refuses_an_older_handshake(daemon13, pki, version):
    """min_version: TLS13. TLS 1.1 would be refused by OpenSSL's own defaults too; TLS 1.2
    is refused only because min_version is applied."""
    assert handshake(daemon13.port, client_context(pki)) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        handshake(daemon13.port, client_context(pki, version))


def test_a_bearer_header_does_not_pass_basic_auth_on_other_paths(daemon13, pki):
    ctx = client_context(pki)
    for path in ("/metrics", "/api/state", "/"):
        status, headers, _ = request(daemon13.port, ctx, path,
                                     headers={"Authorization": "Bearer hook-token-2d9a"})
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic"), path
    assert request(daemon13.port, ctx, "/metrics",
                   headers={"Authorization": basic(USER, PASSWORD)})[0] == 200


def test_the_configured_headers_come_with_every_answer_refusals_too(daemon13, pki):
    ctx = client_context(pki)
    for auth in ({"Authorization": basic(USER, PASSWORD)}, {}):
        status, headers, _ = request(daemon13.port, ctx, "/metrics", headers=auth)
        assert status == (200 if auth else 401)
        assert {k: headers.get(k) for k in HEADERS} == HEADERS, (status, headers)


def test_a_basic_credential_that_is_not_clean_base64_is_refused(daemon13, pki):
    good = basic(USER, PASSWORD).split(" ", 1)[1]
    for value in (f"!{good}", f"{good[:4]}*{good[4:]}", f"{good[:8]} {good[8:]}"):
        status, _, _ = request(daemon13.port, client_context(pki), "/metrics",
                               headers={"Authorization": f"Basic {value}"})
        assert status == 401, value


@pytest.mark.parametrize("scheme", ["Digest", "Bearer", "Negotiate", "Basicx"])
def test_only_the_basic_scheme_carries_credentials(daemon13, pki, scheme):
    """The right user and password, base64 as Basic has them, under another scheme."""
    status, _, _ = request(daemon13.port, client_context(pki), "/metrics",
                           headers={"Authorization": basic(USER, PASSWORD, scheme)})
    assert status == 401


# -- the Guard on a real server, with an inner layer taken away ------------------------------

@contextlib.contextmanager
def serving(guard: Guard, bearer_paths=()):
    """The daemon's own HTTP server with its Guard middleware and TLS context, on a real
    port; every route answers 200 (no handler checks anything of its own)."""
    guard.bearer = frozenset(bearer_paths)

    async def ok(request: server.Request) -> server.Response:
        return server.Response("handled\n")
    app = server.App([server.get("/metrics", ok), server.post("/alertmanager", ok)],
                     middlewares=[guard.middleware])
    loop = asyncio.new_event_loop()
    srv = server.Server(app)
    loop.run_until_complete(srv.start("127.0.0.1", 0, ssl=guard.context))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield srv.port
    finally:
        asyncio.run_coroutine_threadsafe(srv.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_the_webhook_path_still_needs_a_bearer_header_to_skip_basic_auth(pki):
    """Defence in depth: the real webhook checks its own token too. Here its handler checks
    nothing, so the Guard alone must stop a request that brings no credential at all."""
    wc = webconfig.load(write(pki, {"tls_server_config": tls(),
                                    "basic_auth_users": {USER: pki["hash"]}}))
    ctx = client_context(pki)
    with serving(Guard(wc), bearer_paths=["/alertmanager"]) as port:
        status, headers, _ = request(port, ctx, "/alertmanager", "POST", body=b"{}")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
        # a bearer header goes to the handler, whose token check it is; basic auth does too
        assert request(port, ctx, "/alertmanager", "POST", body=b"{}",
                       headers={"Authorization": "Bearer anything"})[0] == 200
        assert request(port, ctx, "/alertmanager", "POST", body=b"{}",
                       headers={"Authorization": basic(USER, PASSWORD)})[0] == 200
        # and a bearer header is no credential on any other path
        assert request(port, ctx, "/metrics",
                       headers={"Authorization": "Bearer anything"})[0] == 401


def test_an_unknown_user_is_refused_even_with_the_dummy_hashs_password(pki, monkeypatch):
    """Defence in depth: nobody knows the password of the dummy hash an unknown name is
    checked against (so that a wrong name costs as long as a wrong password). Here it is
    replaced by the hash of a known one: only the known-user check stands."""
    monkeypatch.setattr(webconfig, "_DUMMY_HASH", bcrypt.hashpw(b"guessed", bcrypt.gensalt(4)))
    wc = webconfig.load(write(pki, {"tls_server_config": tls(),
                                    "basic_auth_users": {USER: pki["hash"]}}))
    ctx = client_context(pki)
    with serving(Guard(wc)) as port:
        assert request(port, ctx, "/metrics",
                       headers={"Authorization": basic("nobody", "guessed")})[0] == 401
        assert request(port, ctx, "/metrics",
                       headers={"Authorization": basic(USER, PASSWORD)})[0] == 200


def test_max_version_refuses_a_newer_handshake(pki):
    wc = webconfig.load(write(pki, {"tls_server_config": tls(max_version="TLS12")}))
    with serving(Guard(wc)) as port:
        assert handshake(port, client_context(pki, ssl.TLSVersion.TLSv1_2)) == "TLSv1.2"
        with pytest.raises(ssl.SSLError):
            handshake(port, client_context(pki, ssl.TLSVersion.TLSv1_3))


# -- refusals: the budget of failed logins, and what is counted ------------------------------

def test_past_its_failed_login_budget_a_client_keeps_a_credential_found_right(pki):
    """An address whose failed logins pass the budget is refused at once (429, no bcrypt),
    but a scraper behind it whose password was found right before still gets in; another
    user's right password, never checked, is refused unchecked like any. Every refusal is
    counted once, under its reason and its client (the daemon exports and logs these). The
    budget refills slowly here, so that a slow machine does not pay it back mid-test."""
    other_hash = bcrypt.hashpw(b"grafana-pass", bcrypt.gensalt(rounds=4)).decode()
    wc = webconfig.load(write(pki, {"tls_server_config": tls(), "basic_auth_users": {
        USER: pki["hash"], "grafana": other_hash}}))
    guard = Guard(wc, failures_per_minute=0.01)
    ctx = client_context(pki)
    good = {"Authorization": basic(USER, PASSWORD)}
    burst = 10  # docs/security.md: 10 failed logins at once, then the configured rate
    with serving(guard) as port:
        assert request(port, ctx, "/metrics", headers=good)[0] == 200
        statuses = [request(port, ctx, "/metrics",
                            headers={"Authorization": basic(USER, f"wrong-{i}")})[0]
                    for i in range(burst + 1)]
        assert statuses == [401] * burst + [429]
        assert request(port, ctx, "/metrics", headers=good)[0] == 200
        assert request(port, ctx, "/metrics",
                       headers={"Authorization": basic("grafana", "grafana-pass")})[0] == 429
    assert guard.refused == {"unauthorized": burst, "rate_limited": 2, "busy": 0}
    assert guard.take_refusals() == {"127.0.0.1": burst + 2}
    assert guard.take_refusals() == {}


def test_refusals_are_told_apart_for_at_most_1000_clients(pki):
    """The refusals' log line names its top clients: at most 1000 are kept between two
    lines, and one already kept is still counted past that. Requests without credentials
    from 1001 addresses go to the Guard's middleware as the server hands them over."""
    wc = webconfig.load(write(pki, {"tls_server_config": tls(),
                                    "basic_auth_users": {USER: pki["hash"]}}))
    guard = Guard(wc)

    async def handler(request):
        return server.Response("handled\n")

    async def refuse(remote: str) -> int:
        req = server.Request("GET", "/metrics", server.Headers(), remote, None)
        return (await guard.middleware(req, handler)).status

    async def go():
        clients = [f"10.0.{i // 256}.{i % 256}" for i in range(1001)]
        assert {await refuse(c) for c in clients} == {401}
        assert await refuse(clients[0]) == 401
        return clients
    clients = asyncio.run(go())
    counted = guard.take_refusals()
    assert len(counted) == 1000 and clients[-1] not in counted
    assert counted[clients[0]] == 2 and guard.refused["unauthorized"] == 1002


@pytest.mark.parametrize("crt, key, words", [
    ("garbage", "garbage", "PEM lib"),
    ("server", "other", "KEY_VALUES_MISMATCH"),
])
def test_a_certificate_that_cannot_be_loaded_is_named_with_openssls_reason(
        pki, tmp_path, crt, key, words):
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    names = {"server": "server.crt", "garbage": str(garbage),
             "other": str(CA(tmp_path, "other-ca").issue("other", server=True)[1])}
    path = write(pki, {"tls_server_config": {"cert_file": names[crt], "key_file": names[key]}})
    with pytest.raises(WebConfigError, match="cannot load the certificate and key") as exc:
        webconfig.load(path)
    assert words in str(exc.value) and "None" not in str(exc.value), exc.value
