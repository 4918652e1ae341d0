"""Fault campaign, network and lifecycle half: a real `gpuwatch run` attacked over real
sockets by real TLS clients in processes of their own (tests/hostile_clients.py), from many
loopback addresses. Each test asserts behaviour: the legitimate scrape succeeds, engine
scrapes and snapshots go on, the log stays small, memory and descriptors stay bounded, the
daemon stops when told. Latencies are measured in benchmarks/hostile_clients.py, not here.

(The rest of the campaign is in test_fault_campaign.py and test_fault_engines.py.)
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import bcrypt
import psutil
import pytest
import yaml
from prometheus_client.parser import text_fd_to_metric_families, text_string_to_metric_families

from tests.helpers import REPO, StaticServer, child_env, eventually, wait_until
from tests.hostile_clients import Attack, Scraper
from tests.test_remediation_webhook import alert, payload
from tests.tls_certs import CA

pytestmark = pytest.mark.integration

USER, PASSWORD = "prometheus", "scrape-pass-77c1"
SECOND, SECOND_PASSWORD = "grafana-agent", "second-pass-0b9e"
TOKEN = "net-campaign-token-0123456789"
SOURCES = ",".join(f"127.0.0.{i}" for i in range(2, 18))  # 16 attacking hosts
VLLM = (REPO / "tests/fixtures/engines/vllm-0.32.0-cpu-real-load.prom").read_text()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = CA(d, "ca")
    ca.issue("server", server=True)
    # Cost 12, as docs/security.md tells operators to hash with.
    hashes = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=12)).decode()
              for u, p in ((USER, PASSWORD), (SECOND, SECOND_PASSWORD))}
    return {"dir": d, "ca": str(ca.crt), "hashes": hashes}


def web_config(pki, tmp_path, *, tls=True, users=(USER, SECOND)) -> Path:
    doc = {"basic_auth_users": {u: pki["hashes"][u] for u in users}}
    if tls:
        for name in ("server.crt", "server.key"):
            (tmp_path / name).write_bytes((pki["dir"] / name).read_bytes())
        doc["tls_server_config"] = {"cert_file": "server.crt", "key_file": "server.key"}
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def nofile(n: int):
    def limit():  # as a service manager's default would leave it (no LimitNOFILE=)
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return limit


def start(daemon, pki, tmp_path, toml: str = "", *, tls=True, preexec=None, args=()):
    web = web_config(pki, tmp_path, tls=tls)
    d = daemon("--simulate", "steady", "--web-config", str(web), *args, wait_ready=False,
               config_toml=toml, preexec=preexec, env={"GPUWATCH_WEBHOOK_TOKEN": TOKEN})
    d.web = web
    d.scraper = Scraper(d.address, USER, PASSWORD, pki["ca"] if tls else None)
    wait_until(lambda: d.alive() and d.scraper.get("/readyz")[0] == 200, 60,
               what="daemon ready over https")
    return d


def sample(body: bytes, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def rss_mb(d) -> float:
    return psutil.Process(d.proc.pid).memory_info().rss / 2**20


def stop_within(d, seconds: float) -> int:
    """SIGTERM; the exit status, which must come within `seconds` (the stop deadline)."""
    d.proc.send_signal(signal.SIGTERM)
    return d.proc.wait(seconds)


def log_problems(out: str) -> list[str]:
    return [line for line in out.splitlines()
            if "Traceback" in line or "out of system resource" in line
            or "Error handling request" in line]


# -- item 2: idle connections ------------------------------------------------------------------

@pytest.mark.slow
def test_idle_connections_leave_scrapes_engines_and_snapshots_working(daemon, pki, tmp_path):
    engine = StaticServer(VLLM.encode())
    try:
        d = start(daemon, pki, tmp_path, textwrap.dedent(f"""
            [[engines]]
            name = "vllm"
            url = "{engine.url}/metrics"
            interval_seconds = 1
            [remediation]
            cooldown_seconds = 0
            [webhook]
            token = "{TOKEN}"
            """), preexec=nofile(512))
        body = wait_until(lambda: (lambda b: b if sample(
            b, "gpuwatch_engine_up", engine="vllm") == 1 else None)(d.scraper.get()[2]), 30,
            what="the engine scraped")
        rss0, log0 = rss_mb(d), len(d.output())
        # More half-sent TLS requests than the descriptor limit, from 16 hosts, re-opened as
        # fast as they are closed.
        attack = Attack("idle", d.address, 600, sources=SOURCES)
        try:
            time.sleep(5)
            engine_seen = []
            for _ in range(10):
                status, _, body = d.scraper.get()
                assert status == 200, status
                engine_seen.append(sample(body, "gpuwatch_last_collect_timestamp_seconds",
                                          source="engine:vllm"))
                time.sleep(1)
            assert sample(body, "gpuwatch_engine_up", engine="vllm") == 1
            assert engine_seen[-1] > engine_seen[0] + 5  # engine scrapes went on
            cap = sample(body, "gpuwatch_http_connections_max")
            assert cap < 512 - 200  # lowered to keep descriptors for the daemon's own work
            uuid = json.loads(d.scraper.get("/api/state")[2])["sample"]["gpus"][0]["uuid"]
            a = alert(fingerprint="under-attack", uuid=uuid, name="GpuwatchGpuMemoryCritical")
            del a["labels"]["pid"], a["labels"]["process"]
            status, _, _ = d.scraper.request(
                "POST", "/alertmanager", json.dumps(payload(a)).encode(),
                {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            assert status == 200
            snapshots = tmp_path / f"state-{d.port}" / "snapshots"
            assert eventually(lambda: any(snapshots.glob("*")), 15), "no snapshot written"
            # More attackers than room: the quietest were closed for newcomers (the header
            # timeout is for fewer: test_handshake_headers_and_unread_responses_have_deadlines).
            assert sample(d.scraper.get()[2], "gpuwatch_http_connections_closed_total",
                          reason="made_room") > 0
            assert rss_mb(d) - rss0 < 120
            out = d.output()
            assert not log_problems(out), log_problems(out)[:3]
            assert out.count("http, since the last such line") <= 2
            assert len(out) - log0 < 20_000
            assert stop_within(d, 15) == 0  # under the attack still
        finally:
            seen = attack.stop()
        assert seen["closed_by_server"] > 600 - cap  # cut off, again and again
    finally:
        engine.close()


def test_handshake_headers_and_unread_responses_have_deadlines(daemon, pki, tmp_path):
    d = start(daemon, pki, tmp_path, "[http]\nheader_timeout_seconds = 2\n"
                                     "write_timeout_seconds = 2\n")
    host, port = d.address.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=pki["ca"])

    def closed_by_server(sock) -> bool:
        sock.settimeout(15)
        try:
            return sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True
        except TimeoutError:
            return False

    silent = socket.create_connection((host, int(port)))  # no TLS handshake at all
    tls = ctx.wrap_socket(socket.create_connection((host, int(port))), server_hostname=host)
    tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    assert closed_by_server(silent) and closed_by_server(tls)
    # A client that asks and does not read: its responses pile up, then it is dropped.
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect((host, int(port)))
    reader = ctx.wrap_socket(raw, server_hostname=host)
    auth = d.scraper.auth
    reader.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n\r\n"
                   .encode() * 200)

    def dropped():
        body = d.scraper.get()[2]
        return sample(body, "gpuwatch_http_connections_closed_total", reason="write_timeout")
    assert wait_until(dropped, 30, what="the unread connection dropped")
    assert not log_problems(d.output())
    for s in (silent, tls, reader):
        s.close()


# -- item 3: bcrypt flood ------------------------------------------------------------------------

@pytest.mark.slow
def test_bcrypt_flood_leaves_legitimate_scrapers_alone(daemon, pki, tmp_path):
    d = start(daemon, pki, tmp_path)
    assert d.scraper.get()[0] == 200  # the verdict is cached from now on
    rss0 = rss_mb(d)
    # One host, so that it spends its budget of failures within the test.
    attack = Attack("flood", d.address, 256, sources="127.0.0.2")
    try:
        time.sleep(5)  # the attacking host has failed by now
        statuses = [d.scraper.get()[0] for _ in range(20)]
        assert statuses == [200] * 20, statuses
        # A scraper that never logged in before: ahead of the failing hosts in bcrypt's
        # queue. Its first try may find the queue full of hosts that had not failed yet.
        second = Scraper(d.address, SECOND, SECOND_PASSWORD, pki["ca"])
        tries = []
        while 200 not in tries and len(tries) < 5:
            tries.append(second.get()[0])
            time.sleep(0 if 200 in tries else 2)
        assert tries[-1] == 200 and set(tries) <= {200, 503}, tries
        def refused():
            body = d.scraper.get()[2]
            return all(sample(body, "gpuwatch_http_logins_refused_total", reason=r) > 0
                       for r in ("unauthorized", "rate_limited", "busy"))
        wait_until(refused, 60, what="401, then 429 past the budget, and 503 when full")
        assert rss_mb(d) - rss0 < 80
        assert stop_within(d, 15) == 0
    finally:
        seen = attack.stop()
    # Refused at once rather than queued: most answers are 429 or 503.
    st = seen["status"]
    assert st.get("429", 0) + st.get("503", 0) > st.get("401", 0), st
    out = d.output()
    assert not log_problems(out)
    assert out.count("logins refused") <= 2


def test_wrong_credentials_never_evict_a_right_one(monkeypatch):
    import asyncio

    from gpuwatch import webconfig

    calls = []
    real = webconfig._checkpw
    monkeypatch.setattr(webconfig, "_checkpw", lambda p, h: calls.append(p) or real(p, h))
    cheap = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))  # cost 4: a quick flood
    auth = webconfig.BasicAuth({"known": cheap})

    def basic(user, password):
        return Scraper("h:1", user, password, None).auth

    async def go():
        assert await auth.check(basic("known", "right"))
        for i in range(2 * webconfig.AUTH_CACHE_ENTRIES):  # unknown users, wrong passwords
            assert not await auth.check(basic("known" if i % 2 else f"nobody{i}", f"w{i}"))
        n = len(calls)
        assert await auth.check(basic("known", "right"))
        return len(calls) - n
    assert asyncio.run(go()) == 0  # still cached: no bcrypt


# -- item 9: non-ASCII credentials ------------------------------------------------------------

def test_non_ascii_authorization_is_401_in_one_piece(daemon, pki, tmp_path):
    d = start(daemon, pki, tmp_path, f"[webhook]\ntoken = \"{TOKEN}\"\n", tls=False)
    host, port = d.address.rsplit(":", 1)
    headers = [b"Basic \xff\xfe\xfd", "Basic é".encode(), b"Basic \xc3\xa9==",
               b"Basic " + __import__("base64").b64encode(b"\xff\xfe:\x80"),
               b"Bearer \xff\xfe", "Basic 用户".encode()]
    log0 = len(d.output())
    for _ in range(10):
        for path in (b"/metrics", b"/alertmanager"):
            for h in headers:
                with socket.create_connection((host, int(port)), timeout=10) as s:
                    method = b"POST" if path == b"/alertmanager" else b"GET"
                    s.sendall(method + b" " + path + b" HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: 0\r\nAuthorization: " + h + b"\r\n\r\n")
                    status = s.recv(64).split(b" ")[1]
                    # 429: this address is past its budget of failed logins
                    assert status in (b"400", b"401", b"429"), (path, h, status)
    out = d.output()[log0:]
    assert not log_problems(out), out[:2000]
    assert len(out.splitlines()) <= 2  # one rate-limited line at most, not one per request
    assert d.scraper.get()[0] == 200


# -- item 11: label values and reloads ---------------------------------------------------------

def test_raw_control_characters_in_engine_labels_parse_everywhere(daemon, tmp_path):
    name = re.search(r'model_name="([^"]*)"', VLLM).group(1)
    engine = StaticServer(VLLM.replace(f'model_name="{name}"',
                                       'model_name="evil\rmodel\x0bx"').encode())
    try:
        d = daemon("--simulate", "steady", "--engine", engine.url + "/metrics")
        body = wait_until(lambda: (lambda b: b if b"evil" in b else None)(
            d.get("/metrics")[1]), 30, what="the engine's series")
    finally:
        engine.close()
    assert b"\r" not in body and b"\x0b" not in body
    r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True,
                       timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    file = tmp_path / "metrics.prom"
    file.write_bytes(body)
    with open(file) as f:  # universal newlines: where a raw CR used to split a line
        models = {s.labels.get("model") for fam in text_fd_to_metric_families(f)
                  for s in fam.samples if s.name == "gpuwatch_engine_up"}
    assert models == {"evil\\rmodel\\x0bx"}
    models = {s.labels.get("model") for fam in text_fd_to_metric_families(
        io.StringIO(body.decode())) for s in fam.samples if s.name == "gpuwatch_engine_up"}
    assert models == {"evil\\rmodel\\x0bx"}


def test_sighup_cannot_turn_basic_auth_off(daemon, pki, tmp_path):
    d = start(daemon, pki, tmp_path, "[nvml]\nslow_interval_seconds = 30\n", tls=False)
    cfg = next(tmp_path.glob("gpuwatch-*.toml"))
    cfg.write_text("[nvml]\nslow_interval_seconds = 31\n")
    d.web.write_text("basic_auth_users: {}\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "configuration reload" in d.output() or "web config reload" in
               d.output(), 15, what="the reload's outcome")
    anonymous = Scraper(d.address, "", "", None)
    anonymous.auth = ""
    assert anonymous.get()[0] == 401
    assert d.scraper.get()[0] == 200
    assert "refused on reload" in d.output()
    # All or nothing: the TOML's change was not applied either.
    state = json.loads(d.scraper.get("/api/state")[2])
    assert state["config"]["nvml"]["slow_interval_seconds"] == 30


# -- item 8: FIFOs on reload, bounded stop -----------------------------------------------------

def test_fifos_on_reload_are_refused_and_stop_stays_bounded(daemon, pki, tmp_path):
    d = start(daemon, pki, tmp_path)
    text = d.web.read_text()
    d.web.unlink()
    os.mkfifo(d.web)  # nobody ever writes to it: an open() for reading would never return
    for _ in range(3):
        d.proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
    wait_until(lambda: "not a regular file (a FIFO)" in d.output(), 15, what="FIFO refused")
    d.web.unlink()
    d.web.write_text(text)
    crt = tmp_path / "server.crt"
    crt.unlink()
    os.mkfifo(crt)  # OpenSSL would block on it too
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "server.crt: not a regular file" in d.output(), 15, what="cert FIFO")
    assert d.scraper.get()[0] == 200
    out = d.output()  # no reload ever ran into its deadline, or stuck behind one
    assert "took more than" not in out and "still stuck" not in out
    assert stop_within(d, 15) == 0


def test_a_stop_held_up_by_a_stuck_thread_still_ends(tmp_path):
    """The stop deadline itself: a thread that exit would wait for forever (open() of a
    FIFO nobody writes) does not keep the process alive."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    code = textwrap.dedent(f"""
        import threading
        from gpuwatch import lifecycle
        threading.Thread(target=open, args=({str(fifo)!r},)).start()  # not a daemon thread
        lifecycle.exit_after(1.0, 3)
        """)
    r = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 3 and "exiting now" in r.stderr, r.stderr


# -- item 12: one daemon per state directory ----------------------------------------------------

def test_a_second_daemon_on_one_state_directory_fails_naming_the_first(daemon, tmp_path):
    state = str(tmp_path / "shared-state")
    first = daemon("--simulate", "steady", env={"STATE_DIRECTORY": state})
    second = daemon("--simulate", "steady", env={"STATE_DIRECTORY": state}, wait_ready=False)
    assert second.proc.wait(60) == 2  # misuse: a restart cannot mend it (exitcodes.py)
    errors = [line for line in second.output().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"pid {first.proc.pid}" in errors[0], errors
    assert "Traceback" not in second.output()
    assert first.get("/metrics")[0] == 200
    # The kernel drops the lock with its holder, however it died: no stale lock.
    first.proc.kill()
    first.proc.wait(10)
    third = daemon("--simulate", "steady", env={"STATE_DIRECTORY": state})
    assert third.get("/readyz")[0] == 200


# -- descriptors run out anyway: one line per interval -----------------------------------------

LISTENER_CHILD = """
import asyncio, logging, os, resource, sys
from gpuwatch.exporter import server
from gpuwatch.exporter.listener import Limits

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

async def line():  # from stdin, without a thread or a new descriptor
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.add_reader(0, lambda: fut.done() or fut.set_result(os.read(0, 1)))
    await fut
    loop.remove_reader(0)

async def main():
    srv = server.Server(server.App(), Limits(max_connections=1000))
    await srv.start("127.0.0.1", 0)
    lst = srv.listener
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    print(lst.sockets[0].getsockname()[1], flush=True)
    await line()
    for fd in held:
        os.close(fd)
    await line()
    print(lst.counters()["accept_errors"], flush=True)

asyncio.run(main())
"""


def test_accept_failing_for_lack_of_descriptors_is_one_line_per_interval(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", LISTENER_CHILD], env=child_env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        clients = [socket.create_connection(("127.0.0.1", port), timeout=10)
                   for _ in range(20)]
        time.sleep(3)  # accept() fails, again and again, for want of a descriptor
        child.stdin.write("\n")
        child.stdin.flush()
        for c in clients:  # descriptors back: the waiting connections are served
            c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert c.recv(12).startswith(b"HTTP/1.1 404")
            c.close()
        child.stdin.write("\n")
        child.stdin.flush()
        errors = int(child.stdout.readline())
    finally:
        child.stdin.close()
        child.wait(30)
    log = child.stderr.read()
    assert errors >= 10
    assert log.count("accept() failed") == 1, log
    assert "Traceback" not in log and "out of system resource" not in log
