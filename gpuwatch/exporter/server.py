"""The daemon's HTTP/1.1 server: h11 parses and frames (strict, sans-I/O, well kept), asyncio
carries the bytes, over TLS when the web configuration asks for it.

The daemon serves a few GET endpoints from bytes it rendered ahead and one bounded POST (the
Alertmanager webhook). A full web framework costs ten times the memory of everything else
it imports, so this is the little it needs: routes, middlewares (basic auth, headers) and
bounds on everything a client controls: header size, body size, time to send a request,
idle keep-alive, and the number of open connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import NamedTuple

import h11
import msgspec

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
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.close_after = False

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
                timeout = KEEPALIVE_TIMEOUT if deadline is None else deadline - loop.time()
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
            await asyncio.wait_for(self.writer.drain(), WRITE_TIMEOUT)

    async def respond(self, resp: Response, head: bool = False) -> None:
        headers = [(k, v) for k, v in resp.headers.items()
                   if k.lower() not in ("content-length", "connection")]
        headers.append(("Content-Length", str(len(resp.body))))
        if self.close_after or self.h11.their_state is not h11.DONE:
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
    """app served on host:port (all interfaces when host is empty), TLS when ssl is given."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.Task] = set()

    async def start(self, host: str | None, port: int, ssl=None) -> None:
        self._server = await asyncio.start_server(self._serve, host or None, port,
                                                  ssl=ssl, reuse_address=True,
                                                  limit=READ_CHUNK)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._open):
                task.cancel()
            await asyncio.gather(*self._open, return_exceptions=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._open) >= MAX_CONNECTIONS:
            writer.close()  # a flood of idle connections does not grow memory
            return
        if task is not None:
            self._open.add(task)
        conn = _Connection(reader, writer)
        peer = writer.get_extra_info("peername")
        remote = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        try:
            await self._requests(conn, remote)
        except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except h11.ProtocolError as exc:
            await self._reject(conn, exc)
        finally:
            if task is not None:
                self._open.discard(task)
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
