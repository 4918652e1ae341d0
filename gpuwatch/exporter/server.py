"""The daemon's HTTP/1.1 server: h11 parses and frames (strict, sans-I/O, well kept), asyncio
carries the bytes, over TLS when the web configuration asks for it.

The daemon serves a few GET endpoints from bytes it rendered ahead and one bounded POST (the
Alertmanager webhook). A full web framework costs ten times the memory of everything else
it imports, so this is the little it needs: routes, middlewares (basic auth, headers) and
bounds on everything a client controls: header size, body size, time to send a request,
idle keep-alive; what a remote party may hold open (connections, per client, the TLS
handshake and the first request's deadline, descriptors) is the listener's
(exporter/listener.py), which accepts for this server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import NamedTuple

import h11
import msgspec

from gpuwatch.exporter.listener import STOP_WAIT_SECONDS, Limits, Listener

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024
MAX_CONNECTIONS = 256
REQUEST_TIMEOUT = 30.0  # from a request's first byte to its last header, and per body read
KEEPALIVE_TIMEOUT = 75.0  # an idle connection between requests (scrapes come every 15-60 s)
WRITE_TIMEOUT = 30.0
READ_CHUNK = 64 * 1024

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 413: "Payload Too Large",
            415: "Unsupported Media Type", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


class Response:
    __slots__ = ("body", "headers", "status")

    def __init__(self, body: bytes | str = b"", status: int = 200,
                 headers: dict[str, str] | None = None,
                 content_type: str = "text/plain; charset=utf-8") -> None:
        self.body = body.encode() if isinstance(body, str) else body
        self.status = status
        self.headers = {"Content-Type": content_type, **(headers or {})}

    @property
    def reason(self) -> str:
        return _REASONS.get(self.status, "")


_json = msgspec.json.Encoder()


def json_response(data, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(data), status, headers, "application/json")


class Headers(dict):
    """A request's headers: names case-insensitive (kept lower-cased)."""

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())

    def get(self, key: str, default=None):
        return super().get(key.lower(), default)


class _BodyTooLarge(Exception):
    pass


class Request:
    """One request: method, path, query string, headers (names lower-cased, repeated ones
    joined with ', ') and the peer's address; the body is read on demand, bounded."""

    def __init__(self, method: str, target: str, headers: Headers, remote: str,
                 conn: _Connection) -> None:
        self.method = method
        self.path, _, self.query_string = target.partition("?")
        self.headers = headers
        self.remote = remote
        self._conn = conn

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isdigit() else None

    async def read(self, limit: int) -> bytes | None:
        """The whole body, or None when it is larger than limit (the connection then closes:
        the rest of the body is not read)."""
        declared = self.content_length
        if declared is not None and declared > limit:
            self._conn.abandon_body()
            return None
        try:
            return await self._conn.read_body(limit)
        except _BodyTooLarge:
            return None


Handler = Callable[[Request], Awaitable[Response]]
Middleware = Callable[[Request, Handler], Awaitable[Response]]


class Route(NamedTuple):
    method: str
    path: str
    handler: Handler


def get(path: str, handler: Handler) -> Route:
    return Route("GET", path, handler)


def post(path: str, handler: Handler) -> Route:
    return Route("POST", path, handler)


class App:
    """Exact-path routes (GET also answers HEAD) behind the middlewares, outermost first."""

    def __init__(self, routes: Iterable[Route] = (), middlewares: Iterable[Middleware] = ()):
        self.routes: dict[str, dict[str, Handler]] = {}
        self.middlewares = list(middlewares)
        self.add_routes(routes)

    def add_routes(self, routes: Iterable[Route]) -> None:
        for r in routes:
            self.routes.setdefault(r.path, {})[r.method] = r.handler

    async def _route(self, request: Request) -> Response:
        methods = self.routes.get(request.path)
        if methods is None:
            return Response("404: Not Found\n", 404)
        handler = methods.get("GET" if request.method == "HEAD" else request.method)
        if handler is None:
            allow = ", ".join(sorted({*methods, *(("HEAD",) if "GET" in methods else ())}))
            return Response("405: Method Not Allowed\n", 405, {"Allow": allow})
        return await handler(request)

    async def handle(self, request: Request) -> Response:
        handler: Handler = self._route
        for mw in reversed(self.middlewares):
            handler = _bind(mw, handler)
        try:
            return await handler(request)
        except Exception:
            log.exception("HTTP %s %s failed", request.method, request.path[:200])
            return Response("500: Internal Server Error\n", 500)


def _bind(mw: Middleware, inner: Handler) -> Handler:
    async def handler(request: Request) -> Response:
        return await mw(request, inner)
    return handler


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 keepalive: float = KEEPALIVE_TIMEOUT, write_timeout: float = WRITE_TIMEOUT
                 ) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.close_after = False
        self.keepalive, self.write_timeout = keepalive, write_timeout

    async def _receive(self, timeout: float) -> None:
        data = await asyncio.wait_for(self.reader.read(READ_CHUNK), timeout)
        self.h11.receive_data(data)  # b"" is the peer's end of stream

    async def next_request(self) -> h11.Request | None:
        """The next request's head; None when the peer is gone or idle too long."""
        deadline = None
        loop = asyncio.get_running_loop()
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if deadline is None and self.h11.trailing_data[0]:
                    deadline = loop.time() + REQUEST_TIMEOUT
                timeout = self.keepalive if deadline is None else deadline - loop.time()
                if timeout <= 0:
                    raise TimeoutError
                try:
                    await self._receive(timeout)
                except TimeoutError:
                    if deadline is None:
                        return None  # idle keep-alive: close quietly
                    raise
                if deadline is None:
                    deadline = loop.time() + REQUEST_TIMEOUT
                continue
            if isinstance(event, h11.Request):
                return event
            return None  # ConnectionClosed, PAUSED

    async def read_body(self, limit: int) -> bytes:
        if self.h11.they_are_waiting_for_100_continue:
            await self._send(self.h11.send(h11.InformationalResponse(status_code=100,
                                                                    headers=[])))
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REQUEST_TIMEOUT
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                await self._receive(max(0.0, deadline - loop.time()))
                continue
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limit:
                    self.abandon_body()
                    raise _BodyTooLarge
                chunks.append(bytes(event.data))
                continue
            if isinstance(event, h11.EndOfMessage):
                return b"".join(chunks)
            raise h11.RemoteProtocolError("connection closed in the body", 400)

    def abandon_body(self) -> None:
        self.close_after = True

    def settle(self) -> None:
        """Take what is left of the request from what has arrived (the end of a request
        without a body is an event of its own); a body still to come means a close."""
        while self.h11.their_state is h11.SEND_BODY:
            event = self.h11.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                self.close_after = True
                return

    async def _send(self, data: bytes | None) -> None:
        if data:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), self.write_timeout)

    async def respond(self, resp: Response, head: bool = False) -> None:
        headers = [(k, v) for k, v in resp.headers.items()
                   if k.lower() not in ("content-length", "connection")]
        headers.append(("Content-Length", str(len(resp.body))))
        if self.close_after or self.h11.their_state is not h11.DONE or (
                resp.headers.get("Connection", "").lower() == "close"):
            # a body we did not read (too large, or not wanted) is not parsed as a request
            self.close_after = True
            headers.append(("Connection", "close"))
        out = self.h11.send(h11.Response(status_code=resp.status, headers=headers,
                                         reason=resp.reason.encode()))
        if not head and resp.body:
            out += self.h11.send(h11.Data(data=resp.body))
        out += self.h11.send(h11.EndOfMessage())
        await self._send(out)

    def reusable(self) -> bool:
        if self.close_after or self.h11.our_state is not h11.DONE or (
                self.h11.their_state is not h11.DONE):
            return False
        self.h11.start_next_cycle()
        return True


class Server:
    """app served on host:port (all interfaces when host is empty), TLS when ssl is given.
    limits: the listener's (default: MAX_CONNECTIONS, and the rest of Limits' defaults);
    refusals: the guard's, for the listener's periodic log line."""

    def __init__(self, app: App, limits: Limits | None = None, *,
                 keepalive_timeout: float | None = None,
                 refusals: Callable[[], dict[str, int]] | None = None) -> None:
        self.app = app
        self.limits = limits
        self.keepalive = keepalive_timeout
        self.refusals = refusals
        self.listener: Listener | None = None
        self._open: set[asyncio.Task] = set()

    async def start(self, host: str | None, port: int, ssl=None) -> None:
        limits = self.limits or Limits(max_connections=MAX_CONNECTIONS,
                                       write_timeout_seconds=WRITE_TIMEOUT)

        def protocol() -> asyncio.Protocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=READ_CHUNK),
                                                self._connected)
        self.listener = Listener(protocol, ssl_context=ssl, limits=limits,
                                 refusals=self.refusals)
        await self.listener.start(host or "", port)

    @property
    def port(self) -> int:
        assert self.listener is not None
        return self.listener.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.stop_accepting()
            tasks = list(self._open)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=STOP_WAIT_SECONDS)
            self.listener.close_all()  # what is left, lingering in TLS shutdowns say
            self.listener = None

    def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A task of our own, not the coroutine handed back to asyncio: Python 3.11's stream
        # callback logs a connection task that ends cancelled (a stop) as a traceback.
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._open.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._open.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("HTTP connection failed", exc_info=task.exception())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        limits = self.listener.limits if self.listener else Limits()
        conn = _Connection(reader, writer, self.keepalive or KEEPALIVE_TIMEOUT,
                           limits.write_timeout_seconds)
        peer = writer.get_extra_info("peername")
        remote = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        try:
            await self._requests(conn, remote)
        except asyncio.CancelledError:
            writer.transport.abort()  # stopping: the connection goes at once
            raise
        except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except h11.ProtocolError as exc:
            await self._reject(conn, exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _requests(self, conn: _Connection, remote: str) -> None:
        while True:
            head = await conn.next_request()
            if head is None:
                return
            if len(head.target) + sum(len(n) + len(v) + 4 for n, v in head.headers) > (
                    MAX_HEADER_BYTES):
                # h11 bounds a head only while it is incomplete: one read can hold more
                raise h11.RemoteProtocolError("request head too long", 431)
            headers = Headers()
            for name, value in head.headers:  # h11 gives names lower-cased
                key, text = name.decode("latin-1"), value.decode("latin-1")
                headers[key] = f"{headers[key]}, {text}" if key in headers else text
            method = head.method.decode("ascii", "replace")
            request = Request(method, head.target.decode("latin-1"), headers, remote, conn)
            resp = await self.app.handle(request)
            conn.settle()
            await conn.respond(resp, head=method == "HEAD")
            if not conn.reusable():
                return

    async def _reject(self, conn: _Connection, exc: h11.ProtocolError) -> None:
        if conn.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        status = getattr(exc, "error_status_hint", 400)
        if "too long" in str(exc).lower() or "exceeded" in str(exc).lower():
            status = 431
        conn.close_after = True
        with contextlib.suppress(Exception):
            await conn.respond(Response(f"{status}: {_REASONS.get(status, 'Bad Request')}\n",
                                        status))
