"""TLS, client certificates and basic auth on every endpoint, from an exporter-toolkit web
configuration file: validation, then a real daemon scraped by a real Prometheus over TLS with
basic auth, curl with and without credentials, and mTLS with and without a client cert."""

from __future__ import annotations

import asyncio
import base64
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import bcrypt
import pytest
import yaml
from cryptography import x509

from gpuwatch import webconfig
from gpuwatch.webconfig import WebConfigError
from tests.helpers import child_env, wait_until
from tests.tls_certs import CA

USER, PASSWORD = "prometheus", "scrape-pass-6d1f"
ENDPOINTS = ("/metrics", "/api/state", "/healthz", "/readyz", "/")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = CA(d, "ca")
    server = ca.issue("server", server=True)
    client = ca.issue("client", server=False)
    rogue = CA(d, "rogue-ca").issue("rogue-client", server=False)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    return {"dir": d, "ca": ca.crt, "server": server, "client": client, "rogue": rogue,
            "hash": hashed}


def write_web(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def tls_doc(pki, **extra) -> dict:
    # Relative names: they resolve against the web configuration's own directory.
    return {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", **extra},
            "basic_auth_users": {USER: pki["hash"]}}


# -- validation ------------------------------------------------------------------------------

@pytest.mark.parametrize("doc, words", [
    ({"tls_server_config": {"cert_file": "server.crt"}}, "tls_server_config.key_file: required"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_auth_type": "Sometimes"}}, "client_auth_type: 'Sometimes'"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_auth_type": "RequireAnyClientCert",
                            "client_ca_file": "ca.crt"}},
     "RequireAnyClientCert is not supported"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_ca_file": "ca.crt"}}, "client_ca_file: given without"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_auth_type": "RequireAndVerifyClientCert"}},
     "client_ca_file: required"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "min_version": "TLS9"}}, "min_version: 'TLS9'"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "min_version": "TLS13", "max_version": "TLS12"}}, "below min_version"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "cipher_suites": ["x"]}}, "cipher_suites: not supported"),
    ({"tls_server_config": {"cert_file": "absent.crt", "key_file": "server.key"}},
     "absent.crt: file not found"),
    ({"tls_server_config": {"cert_file": "ca.crt", "key_file": "server.key"}},
     "cannot load the certificate and key"),
    ({"basic_auth_users": {"u": "plain-password-oops"}}, "basic_auth_users.u: not a bcrypt hash"),
    ({"basic_auth_user": {}}, "basic_auth_user: unknown key"),
    ({"basic_auth_users": ["u"]}, "basic_auth_users: Expected `object`"),
])
def test_invalid_web_configs_are_one_line_errors(pki, doc, words):
    path = write_web(pki["dir"] / "bad.yml", doc)
    with pytest.raises(WebConfigError) as info:
        webconfig.load(path)
    msg = str(info.value)
    assert words in msg and str(path) in msg and "\n" not in msg
    assert "plain-password-oops" not in msg


def test_invalid_yaml_and_missing_file(pki):
    bad = pki["dir"] / "y.yml"
    bad.write_text("a: 1\n  b: [\n")
    with pytest.raises(WebConfigError, match="invalid YAML at line 2"):
        webconfig.load(bad)
    with pytest.raises(WebConfigError, match="No such file"):
        webconfig.load(pki["dir"] / "absent.yml")


def test_cli_exits_2_with_one_line(pki, tmp_path):
    path = write_web(pki["dir"] / "cli-bad.yml", {"tls_server_config": {"cert_file": "x"}})
    r = subprocess.run([sys.executable, "-m", "gpuwatch", "run", "--simulate", "steady",
                        "--listen", "127.0.0.1:0", "--web-config", str(path)],
                       capture_output=True, text=True, env=child_env(), timeout=60, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("gpuwatch: configuration error: web config ")
    assert len(r.stderr.strip().splitlines()) == 1


def test_relative_paths_resolve_against_the_file(pki, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing relative to the working directory
    wc = webconfig.load(write_web(pki["dir"] / "rel.yml", tls_doc(pki)))
    assert wc.tls.cert_file == pki["dir"] / "server.crt"
    assert webconfig.ssl_context(wc) is not None


def test_basic_auth_pays_bcrypt_once_per_credential(pki, monkeypatch):
    calls = []
    real = webconfig._checkpw
    monkeypatch.setattr(webconfig, "_checkpw", lambda p, h: calls.append(p) or real(p, h))
    auth = webconfig.BasicAuth({USER: pki["hash"].encode()})
    good = basic(USER, PASSWORD)

    async def go():
        return ([await auth.check(good) for _ in range(50)],
                [await auth.check(basic(USER, "wrong")) for _ in range(5)],
                await auth.check(basic("nobody", PASSWORD)), await auth.check("Basic !!"),
                await auth.check("Bearer x"))
    oks, wrong, unknown, garbage, bearer = asyncio.run(go())
    assert all(oks) and not any(wrong) and not unknown and not garbage and not bearer
    # One bcrypt per distinct credential, including the unknown user (no timing shortcut).
    assert len(calls) == 3


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- a real daemon ---------------------------------------------------------------------------

def curl(url: str, *args: str) -> tuple[int, str]:
    """(exit status, HTTP status or ''): Debian's curl, as an operator would run it."""
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                        "--max-time", "5", *args, url], capture_output=True, text=True,
                       timeout=30)
    return r.returncode, r.stdout.strip()


def start(daemon, pki, doc, *extra, config_toml=None):
    web = write_web(pki["dir"] / f"web-{time.monotonic_ns()}.yml", doc)
    d = daemon("--simulate", "steady", "--web-config", str(web), *extra,
               env={"GPUWATCH_WEBHOOK_TOKEN": "hook-token-91c2"}, wait_ready=False,
               config_toml=config_toml)
    d.https = f"https://{d.address}"
    return d


def wait_https(d, *args: str) -> None:
    def ready():
        if not d.alive():
            raise RuntimeError(d.output())
        return curl(d.https + "/readyz", *args) == (0, "200")
    wait_until(ready, 30, what="daemon over https")


@pytest.mark.integration
def test_prometheus_scrapes_over_tls_with_basic_auth_and_curl_needs_credentials(
        daemon, prometheus, pki):
    # More failed logins than one address may make by default (tests/test_hostile_net.py).
    d = start(daemon, pki, tls_doc(pki), config_toml="[http]\nauth_failures_per_minute = 0\n")
    ca = ["--cacert", str(pki["ca"])]
    creds = [*ca, "-u", f"{USER}:{PASSWORD}"]
    wait_https(d, *creds)
    for path in ENDPOINTS:
        assert curl(d.https + path, *ca) == (0, "401"), path
        assert curl(d.https + path, *ca, "-u", f"{USER}:wrong") == (0, "401"), path
        assert curl(d.https + path, *creds) == (0, "200"), path
    # The webhook takes its bearer token (Alertmanager sends one credential), never nothing.
    post = ["-X", "POST", "-H", "Content-Type: application/json", "-d", "{}"]
    assert curl(d.https + "/alertmanager", *ca, *post) == (0, "401")
    assert curl(d.https + "/alertmanager", *ca, *post, "-H", "Authorization: Bearer no") == (
        0, "401")
    assert curl(d.https + "/alertmanager", *ca, *post,
                "-H", "Authorization: Bearer hook-token-91c2")[1] == "400"
    # Plain HTTP on the TLS port gets nowhere.
    assert curl(d.url + "/metrics", "-u", f"{USER}:{PASSWORD}")[1] in ("000", "400")
    pw = pki["dir"] / "prometheus-password"
    pw.write_text(PASSWORD)
    prom = prometheus([d.address], scrape={
        "scheme": "https", "tls_config": {"ca_file": str(pki["ca"])},
        "basic_auth": {"username": USER, "password_file": str(pw)}})
    prom.wait_for('up{job="gpuwatch"} == 1')
    prom.wait_for('gpuwatch_build_info{job="gpuwatch"}')


@pytest.mark.integration
def test_mtls_rejects_clients_without_a_certificate_from_the_ca(daemon, pki):
    client_crt, client_key = pki["client"]
    rogue_crt, rogue_key = pki["rogue"]
    d = start(daemon, pki, tls_doc(pki, client_auth_type="RequireAndVerifyClientCert",
                                   client_ca_file="ca.crt"))
    ca = ["--cacert", str(pki["ca"]), "-u", f"{USER}:{PASSWORD}"]
    good = [*ca, "--cert", str(client_crt), "--key", str(client_key)]
    wait_https(d, *good)
    assert curl(d.https + "/metrics", *good) == (0, "200")
    status, code = curl(d.https + "/metrics", *ca)
    assert status != 0 and code == "000"  # the handshake fails: no HTTP at all
    status, code = curl(d.https + "/metrics", *ca, "--cert", str(rogue_crt),
                        "--key", str(rogue_key))
    assert status != 0 and code == "000"


@pytest.mark.integration
def test_api_state_can_be_turned_off(daemon, tmp_path):
    d = daemon("--simulate", "steady", config_toml="[http]\napi_state = false\n")
    status, body = d.get("/api/state")
    assert status == 404 and body == b"/api/state is off ([http] api_state = false)\n"
    assert d.get("/metrics")[0] == 200



@pytest.mark.integration
def test_sighup_reloads_users_and_a_rotated_certificate(daemon, tmp_path):
    ca = CA(tmp_path, "ca")
    ca.issue("server", server=True)
    first = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    web = write_web(tmp_path / "web.yml", tls_doc({"hash": first}))
    d = daemon("--simulate", "steady", "--web-config", str(web), wait_ready=False)
    d.https = f"https://{d.address}"
    cacert = ["--cacert", str(ca.crt)]
    wait_https(d, *cacert, "-u", f"{USER}:{PASSWORD}")
    before = served_cert(d.address, ca.crt)
    # Rotate the certificate and key under the same names; a new user replaces the old one.
    new_crt, new_key = ca.issue("rotated", server=True)
    shutil.copy(new_crt, tmp_path / "server.crt")
    shutil.copy(new_key, tmp_path / "server.key")
    second = bcrypt.hashpw(b"second-pass", bcrypt.gensalt(rounds=10)).decode()
    write_web(web, {**tls_doc({"hash": first}), "basic_auth_users": {"second": second}})
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "web config reloaded" in d.output(), 10, what="reload")
    assert curl(d.https + "/metrics", *cacert, "-u", "second:second-pass") == (0, "200")
    assert curl(d.https + "/metrics", *cacert, "-u", f"{USER}:{PASSWORD}") == (0, "401")
    after = served_cert(d.address, ca.crt)
    rotated = x509.load_pem_x509_certificate(new_crt.read_bytes())
    assert before != after
    assert x509.load_der_x509_certificate(after).serial_number == rotated.serial_number
    # A broken file keeps what is served, and says why.
    web.write_text("tls_server_config: {cert_file: gone.crt, key_file: gone.key}\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "web config reload rejected" in d.output(), 10, what="rejection")
    assert curl(d.https + "/metrics", *cacert, "-u", "second:second-pass") == (0, "200")


def served_cert(address: str, ca: Path) -> bytes:
    """The DER certificate the daemon presents to a new connection."""
    ctx = ssl.create_default_context(cafile=str(ca))
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock, ctx.wrap_socket(
            sock, server_hostname=host) as tls:
        return tls.getpeercert(binary_form=True)
