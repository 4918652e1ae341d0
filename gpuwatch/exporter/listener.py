"""The listening sockets, guarded. gpuwatch accepts connections itself (asyncio's own accept
loop logs a traceback per failed accept() and retries at once, which made a descriptor
shortage into hundreds of megabytes of log), so that what a remote party holds open is
bounded before a byte is parsed:

- at most `max_connections` open, `max_connections_per_client` per client address; past the
  cap, the client holding the most connections gives up its quietest idle one to a newcomer
  from a client holding fewer, or else the newcomer is refused: a scraper that holds one
  connection gets in however many others the attackers hold;
- the TLS handshake and the first request's headers must arrive within the header timeout;
  one whose response the client does not read is dropped after the write timeout, even where
  closing it would wait for the client (the server bounds idle keep-alive and later requests);
- descriptors are kept below RLIMIT_NOFILE for the daemon's own work (engine scrapes, probe
  reads, snapshots, logs): the cap is lowered to fit, never the reserve;
- an accept() that fails for lack of descriptors, and every refusal, is counted and logged
  once per interval, not once per try.

The server (exporter/server.py, h11) parses HTTP; this only counts bytes and looks for the end
of the first headers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuwatch.admission import client_key
from gpuwatch.exporter.families.http import CLOSE_REASONS
from gpuwatch.exporter.sockets import bind, descriptor_cap, smaller_tls_buffers

if TYPE_CHECKING:
    import ssl

log = logging.getLogger("gpuwatch.http")

SWEEP_SECONDS = 0.5
LOG_INTERVAL_SECONDS = 60.0
ACCEPT_RETRY_SECONDS = 0.1
ACCEPT_BATCH = 64
# A stop waits at most this long for each of its steps: handshakes, then requests.
STOP_WAIT_SECONDS = 2.0
# A TLS close waits this long for the client's close_notify (asyncio: 30 s), holding a slot.
TLS_SHUTDOWN_SECONDS = 2.0
# Closing connections still hold their descriptors: at most this many above the cap (less
# than RESERVED_FDS, with room for a batch of accepts).
CLOSING_SLACK = 96
# How far from the quietest end a connection to close is looked for.
EVICT_SCAN = 64
_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@dataclass
class Limits:
    max_connections: int = 512
    max_connections_per_client: int = 64
    header_timeout_seconds: float = 10.0
    write_timeout_seconds: float = 30.0

    @classmethod
    def of(cls, http: Any) -> Limits:
        """From the configuration's [http] section."""
        return cls(http.max_connections, http.max_connections_per_client,
                   http.header_timeout_seconds, http.write_timeout_seconds)


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    client: str
    accepted: float
    last_rx: float
    transport: asyncio.Transport | None = None
    headers_done: bool = False
    tail: bytes = b""
    stalled_since: float | None = None
    closing: bool = False  # aborted: its descriptor is still open until asyncio lets go
    closed: bool = False


class _Protocol(asyncio.Protocol):
    """Sits in front of the server's protocol: notes activity, then hands everything on."""

    def __init__(self, listener: Listener, conn: _Conn, inner: asyncio.Protocol) -> None:
        self.listener, self.conn, self.inner = listener, conn, inner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn.transport = transport  # type: ignore[assignment]
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.listener._received(self.conn, data)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listener._forget(self.conn)
        self.inner.connection_lost(exc)


@dataclass
class _Tally:
    """Counts since the last log line, and in all."""

    total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLOSE_REASONS, 0))
    recent: dict[str, int] = field(default_factory=dict)
    clients: dict[str, int] = field(default_factory=dict)
    accept_errors: int = 0
    recent_accept_errors: int = 0
    last_error: str = ""


class Listener:
    def __init__(self, factory: Callable[[], asyncio.Protocol], *,
                 ssl_context: ssl.SSLContext | None, limits: Limits,
                 refusals: Callable[[], dict[str, int]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """factory: the server's protocol for one connection. refusals: returns (and resets)
        auth refusals per client, for the same periodic log line."""
        self.factory = factory
        self.ssl = ssl_context
        self.limits = limits
        self.refusals = refusals
        self.clock = clock
        self.cap = limits.max_connections
        self._conns: set[_Conn] = set()  # every socket, closing ones until they are closed
        # Per client, its connections not closing, least recently active first.
        self._clients: dict[str, OrderedDict[_Conn, None]] = {}
        self._socks: list[socket.socket] = []
        self._tasks: set[asyncio.Task] = set()
        self._tally = _Tally()
        self._logged_at = -LOG_INTERVAL_SECONDS
        self._bugs: set[str] = set()
        self._retries: dict[int, asyncio.TimerHandle] = {}
        self._wake = asyncio.Event()  # a connection to sweep, after none

    # -- starting and stopping -------------------------------------------------------------
    async def start(self, host: str, port: int) -> None:
        """Bind and listen (host '' or None: every interface). Raises OSError."""
        self.cap = descriptor_cap(self.limits.max_connections)
        if self.ssl is not None:
            smaller_tls_buffers()
        self._socks = bind(host or None, port)
        for sock in self._socks:
            self._listen(sock)
        self._spawn(self._sweep_loop())

    @property
    def sockets(self) -> list[socket.socket]:
        return list(self._socks)

    async def stop_accepting(self) -> None:
        """Stop accepting, and end the TLS handshakes in progress."""
        loop = asyncio.get_running_loop()
        for sock in self._socks:
            loop.remove_reader(sock.fileno())
        for handle in self._retries.values():
            handle.cancel()
        for sock in self._socks:
            sock.close()
        self._socks = []
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: close_all() aborts whatever is still open after it
            await asyncio.wait(tasks, timeout=STOP_WAIT_SECONDS)

    def close_all(self) -> None:
        """Abort what is still open (after the server's own shutdown had its chance), and log
        what the last interval's line has not said yet."""
        for conn in list(self._conns):
            self._abort(conn)
        self._logged_at = -LOG_INTERVAL_SECONDS
        self._maybe_log()

    def counters(self) -> dict[str, Any]:
        return {"open": len(self._conns), "cap": self.cap, "closed": dict(self._tally.total),
                "accept_errors": self._tally.accept_errors}

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- accepting ---------------------------------------------------------------------------
    # A reader callback, not loop.sock_accept(): in Python 3.11 a sock_accept() cancelled at
    # the wrong moment still accepts a connection, loses it and logs a traceback.
    def _listen(self, lsock: socket.socket) -> None:
        self._retries.pop(lsock.fileno(), None)
        asyncio.get_running_loop().add_reader(lsock.fileno(), self._accept_ready, lsock)

    def _accept_ready(self, lsock: socket.socket) -> None:
        """The backlog at once (up to a batch), so that a client does not wait behind a
        queue of attackers in the kernel; the next batch on the next loop turn, after closed
        connections have let go of their descriptors."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                self._accept_failed(lsock, exc)
                return
            sock.setblocking(False)
            self._admit_safely(sock, addr)

    def _accept_failed(self, lsock: socket.socket, exc: OSError) -> None:
        """Counted, logged once per interval, and retried a little later (the socket stays
        readable: retrying at once would spin)."""
        t = self._tally
        t.accept_errors += 1
        t.recent_accept_errors += 1
        self._wake.set()
        t.last_error = os.strerror(exc.errno) if exc.errno else str(exc)
        self._maybe_log()
        if exc.errno in _NO_DESCRIPTORS:
            self._make_room(0)
        loop = asyncio.get_running_loop()
        loop.remove_reader(lsock.fileno())
        self._retries[lsock.fileno()] = loop.call_later(ACCEPT_RETRY_SECONDS, self._listen,
                                                        lsock)

    def _admit_safely(self, sock: socket.socket, addr: Any) -> None:
        try:
            self._admit(sock, addr)
        except Exception:  # a bug here must not stop the accept loop, nor flood the log
            with contextlib.suppress(OSError):
                sock.close()
            self._bug("admitting a connection")

    def _bug(self, what: str) -> None:
        if what not in self._bugs:
            self._bugs.add(what)
            log.exception("http: %s failed (logged once)", what)

    def _admit(self, sock: socket.socket, addr: Any) -> None:
        now = self.clock()
        client = client_key(addr[0] if isinstance(addr, tuple) else None)
        held = len(self._clients.get(client, ()))
        if held >= self.limits.max_connections_per_client:
            self._refuse(sock, "client_limit", client)
            return
        if len(self._conns) >= self.cap and not (
                self._make_room(held) and len(self._conns) < self.cap + CLOSING_SLACK):
            self._refuse(sock, "over_capacity", client)
            return
        conn = _Conn(sock=sock, client=client, accepted=now, last_rx=now)
        self._conns.add(conn)
        self._wake.set()
        self._clients.setdefault(client, OrderedDict())[conn] = None
        self._spawn(self._serve(conn))

    async def _serve(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                lambda: _Protocol(self, conn, self.factory()), conn.sock, ssl=self.ssl,
                ssl_handshake_timeout=self.limits.header_timeout_seconds if self.ssl else None,
                ssl_shutdown_timeout=TLS_SHUTDOWN_SECONDS if self.ssl else None)
        except OSError:  # ssl.SSLError and TimeoutError are OSErrors too
            # A failed or slow handshake: asyncio closed the socket. Nothing to log per try.
            self._forget(conn)
        except BaseException as exc:
            self._forget(conn)
            with contextlib.suppress(OSError):
                conn.sock.close()
            if not isinstance(exc, Exception):  # cancelled: stopping
                raise
            self._bug("setting up a connection")  # not "Task exception was never retrieved"

    def _refuse(self, sock: socket.socket, reason: str, client: str) -> None:
        with contextlib.suppress(OSError):
            sock.close()
        self._count(reason, client)

    # -- per connection ------------------------------------------------------------------------
    def _received(self, conn: _Conn, data: bytes) -> None:
        conn.last_rx = self.clock()
        mine = self._clients.get(conn.client)
        if mine is not None and conn in mine:
            mine.move_to_end(conn)
        if not conn.headers_done:
            seen = conn.tail + data
            if b"\n\r\n" in seen or b"\n\n" in seen:
                conn.headers_done, conn.tail = True, b""
            else:
                conn.tail = seen[-2:]

    def _forget(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.discard(conn)
        self._leave_client(conn)

    def _leave_client(self, conn: _Conn) -> None:
        mine = self._clients.get(conn.client)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._clients[conn.client]

    def _abort(self, conn: _Conn) -> None:
        """Close now; it is counted until asyncio has closed its socket (_forget)."""
        conn.closing = True
        self._leave_client(conn)
        transport = conn.transport
        if transport is not None:
            transport.abort()
        else:  # still in the TLS handshake, inside asyncio: end it from the socket's side
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def _unsent(self, conn: _Conn) -> bool:
        """Bytes are waiting for the client, being answered or being closed."""
        transport = conn.transport
        return transport is not None and transport.get_write_buffer_size() > 0

    def _answering(self, conn: _Conn) -> bool:
        return self._unsent(conn) and not conn.transport.is_closing()

    def _make_room(self, held: int) -> bool:
        """For a newcomer whose client holds `held` connections: close one of the client
        holding the most, if that is more, choosing its quietest connection not being
        answered, and of those one that finished its handshake without sending a whole
        request (what an idle attacker holds), then an idle keep-alive one, then one still
        in its handshake."""
        if not self._clients:
            return False
        mine = max(self._clients.values(), key=len)
        if len(mine) <= held:
            return False
        best: tuple[int, _Conn] | None = None
        for i, conn in enumerate(mine):
            if i >= EVICT_SCAN:
                break
            if self._answering(conn):
                continue
            rank = 2 if conn.transport is None else 1 if conn.headers_done else 0
            if best is None or rank < best[0]:
                best = (rank, conn)
                if rank == 0:
                    break
        if best is None:
            return False
        self._count("made_room", best[1].client)
        self._abort(best[1])
        return True

    async def _sweep_loop(self) -> None:
        while True:
            t = self._tally
            if self._conns or t.recent or t.recent_accept_errors:
                await asyncio.sleep(SWEEP_SECONDS)
            else:  # nothing can time out: no wake-ups until a connection comes (or a minute)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LOG_INTERVAL_SECONDS):
                        await self._wake.wait()
            try:
                self.sweep()
            except Exception:
                self._bug("the connection sweep")

    def sweep(self) -> None:
        now = self.clock()
        deadline = now - self.limits.header_timeout_seconds
        for conn in list(self._conns):
            if conn.closing:
                continue
            if not conn.headers_done and conn.accepted < deadline:
                self._abort(conn)
                self._count("header_timeout", conn.client)
            elif self._unsent(conn):  # a close waits for them too: never for ever
                if conn.stalled_since is None:
                    conn.stalled_since = now
                elif now - conn.stalled_since > self.limits.write_timeout_seconds:
                    self._abort(conn)
                    self._count("write_timeout", conn.client)
            else:
                conn.stalled_since = None
        self._maybe_log()

    # -- accounting ------------------------------------------------------------------------------
    def _count(self, reason: str, client: str) -> None:
        t = self._tally
        self._wake.set()
        t.total[reason] += 1
        t.recent[reason] = t.recent.get(reason, 0) + 1
        if len(t.clients) < 1000 or client in t.clients:
            t.clients[client] = t.clients.get(client, 0) + 1

    def _maybe_log(self) -> None:
        """At most one line per interval, saying what was refused, closed or failed in it."""
        now = self.clock()
        if now - self._logged_at < LOG_INTERVAL_SECONDS:
            return
        t = self._tally
        auth = self.refusals() if self.refusals else {}
        if not (t.recent or t.recent_accept_errors or auth):
            return
        self._logged_at = now
        parts = [f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(t.recent.items())]
        if parts:
            parts = [f"connections closed: {', '.join(parts)}; top clients: "
                     f"{_top(t.clients)}"]
        if t.recent_accept_errors:
            parts.append(f"accept() failed {t.recent_accept_errors} times "
                         f"({t.last_error}; {len(self._conns)} open, cap {self.cap})")
        if auth:
            parts.append(f"{sum(auth.values())} logins refused; top clients: {_top(auth)}")
        log.warning("http, since the last such line: %s", "; ".join(parts))  # one per interval
        t.recent, t.clients, t.recent_accept_errors = {}, {}, 0


def _top(counts: dict[str, int], n: int = 3) -> str:
    best = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{client or 'unknown'} ({k})" for client, k in best)
