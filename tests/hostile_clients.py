"""Hostile network clients, each run as its own process against a real daemon:

    python -m tests.hostile_clients idle  HOST:PORT --connections 1024 [--tls] [--sources A,B]
    python -m tests.hostile_clients flood HOST:PORT --concurrency 512 [--tls] [--sources A,B]

`idle` holds connections open with a half-sent request (after the TLS handshake, when --tls),
and opens a new one for each the server closes; `flood` sends requests with distinct wrong
basic-auth credentials as fast as the server answers. Both run for --seconds (or until
stdin closes, when --seconds is 0), then print one JSON line of what they saw. Sources are
local addresses to connect from (127.0.0.2, 127.0.0.3, ...: loopback has a /8), cycled over.

The legitimate side, `Scraper`, is in-process: a new TLS connection per scrape, as a
Prometheus that reconnects does, with a 10 s timeout, as Prometheus's default.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import itertools
import json
import os
import resource
import secrets
import ssl
import sys
import time

PARTIAL = b"GET /metrics HTTP/1.1\r\nHost: gpuwatch\r\nUser-Agent: slow"


def _client_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # an attacker does not care who answers
    return ctx


async def _idle(host: str, port: int, n: int, tls: bool, sources: list[str],
                stop: asyncio.Event) -> dict:
    ctx = _client_context() if tls else None
    stats = {"opened": 0, "closed_by_server": 0, "failed": 0, "open_max": 0}
    open_now = 0
    src = itertools.cycle(sources)

    async def one() -> None:
        nonlocal open_now
        while not stop.is_set():
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(
                    host, port, ssl=ctx, local_addr=(next(src), 0)), 30)
                w.write(PARTIAL)
                await w.drain()
            except (OSError, TimeoutError, ssl.SSLError):
                stats["failed"] += 1
                await asyncio.sleep(0.5)
                continue
            stats["opened"] += 1
            open_now += 1
            stats["open_max"] = max(stats["open_max"], open_now)
            with contextlib.suppress(OSError, ssl.SSLError):
                reader = asyncio.ensure_future(r.read(65536))
                await asyncio.wait([reader, asyncio.ensure_future(stop.wait())],
                                   return_when=asyncio.FIRST_COMPLETED)
                if reader.done():
                    stats["closed_by_server"] += 1
                reader.cancel()
            open_now -= 1
            w.transport.abort()
            await asyncio.sleep(0.5)

    await asyncio.gather(*(one() for _ in range(n)))
    return stats


async def _flood(host: str, port: int, n: int, tls: bool, sources: list[str],
                 stop: asyncio.Event) -> dict:
    ctx = _client_context() if tls else None
    stats: dict = {"requests": 0, "failed": 0, "status": {}}
    src = itertools.cycle(sources)

    async def one() -> None:
        while not stop.is_set():
            creds = base64.b64encode(
                f"u{secrets.token_hex(4)}:{secrets.token_hex(8)}".encode()).decode()
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(
                    host, port, ssl=ctx, local_addr=(next(src), 0)), 30)
                w.write(f"GET /metrics HTTP/1.1\r\nHost: gpuwatch\r\nAuthorization: Basic "
                        f"{creds}\r\nConnection: close\r\n\r\n".encode())
                line = await asyncio.wait_for(r.readline(), 60)
                w.transport.abort()
            except (OSError, TimeoutError, ssl.SSLError):
                stats["failed"] += 1
                await asyncio.sleep(0.1)
                continue
            stats["requests"] += 1
            code = line.split(b" ")[1].decode() if line.count(b" ") >= 2 else "none"
            stats["status"][code] = stats["status"].get(code, 0) + 1

    await asyncio.gather(*(one() for _ in range(n)))
    return stats


async def _main(args) -> dict:
    host, port = args.target.rsplit(":", 1)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if args.seconds:
        loop.call_later(args.seconds, stop.set)
    else:  # until the parent closes our stdin
        loop.add_reader(sys.stdin.fileno(), stop.set)
    attack = _idle if args.kind == "idle" else _flood
    return await attack(host, int(port), args.n, args.tls, args.sources.split(","), stop)


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["idle", "flood"])
    p.add_argument("target")
    p.add_argument("--connections", "--concurrency", dest="n", type=int, default=1024)
    p.add_argument("--tls", action="store_true")
    p.add_argument("--sources", default="127.0.0.2")
    p.add_argument("--seconds", type=float, default=0)
    args = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.n * 2 + 256)),
                                                    hard))
    print(json.dumps(asyncio.run(_main(args))), flush=True)


class Attack:
    """One hostile client process, until stop() (which returns its JSON line)."""

    def __init__(self, kind: str, address: str, n: int, *, tls: bool = True,
                 sources: str = "127.0.0.2") -> None:
        import subprocess

        from tests.helpers import child_env

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.hostile_clients", kind, address, "--connections",
             str(n), "--sources", sources, *(["--tls"] if tls else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env())

    def stop(self, timeout: float = 60) -> dict:
        self.proc.stdin.close()
        self.proc.stdin = None  # closed: the child's signal to stop
        out, _ = self.proc.communicate(timeout=timeout)
        lines = out.decode().strip().splitlines()
        return json.loads(lines[-1]) if lines else {}


class Scraper:
    """A legitimate scraper: GET with basic auth on a new connection each time."""

    def __init__(self, address: str, user: str, password: str, ca: str | None,
                 timeout: float = 10.0, source: str = "127.0.0.1") -> None:
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.ctx = ssl.create_default_context(cafile=ca) if ca else None
        self.timeout = timeout
        self.source = source

    def get(self, path: str = "/metrics") -> tuple[int | str, float, bytes]:
        """(status, or the error's name; seconds; body)."""
        return self.request("GET", path)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int | str, float, bytes]:
        t0 = time.perf_counter()
        cls = http.client.HTTPSConnection if self.ctx else http.client.HTTPConnection
        kw = {"context": self.ctx} if self.ctx else {}
        conn = cls(self.host, self.port, timeout=self.timeout,
                   source_address=(self.source, 0), **kw)
        try:
            conn.request(method, path, body=body,
                         headers={"Authorization": self.auth, **(headers or {})})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, time.perf_counter() - t0, data
        except (OSError, http.client.HTTPException) as exc:
            return type(exc).__name__, time.perf_counter() - t0, b""
        finally:
            conn.close()


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


if __name__ == "__main__":
    main()
