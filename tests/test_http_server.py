"""The daemon's HTTP server on a loopback port, spoken to with raw sockets: routing, HEAD,
keep-alive, and every bound a hostile client meets (header size, body size, time to send a
request, number of connections)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gpuwatch.exporter import server


async def _serve(**patch):
    async def hello(request):
        return server.Response(f"hello {request.query_string}\n")

    async def echo(request):
        body = await request.read(1000)
        if body is None:
            return server.Response("too large\n", 413)
        return server.Response(body, content_type="application/octet-stream")

    app = server.App([server.get("/hello", hello), server.post("/echo", echo)])
    srv = server.Server(app)
    await srv.start("127.0.0.1", 0)
    return srv


async def _exchange(port: int, data: bytes, read_timeout: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    out = b""
    with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(65536), read_timeout):
            out += chunk
    writer.close()
    return out


def run(coro):
    return asyncio.run(coro)


def test_routes_head_405_404_and_keep_alive():
    async def go():
        srv = await _serve()
        try:
            two = (b"GET /hello?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"
                   b"HEAD /hello HTTP/1.1\r\nHost: a\r\n\r\n"
                   b"DELETE /hello HTTP/1.1\r\nHost: a\r\n\r\n"
                   b"GET /nope HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            return await _exchange(srv.port, two)
        finally:
            await srv.close()
    out = run(go()).decode()
    answers = out.split("HTTP/1.1 ")[1:]
    assert [a[:3] for a in answers] == ["200", "200", "405", "404"], out
    assert answers[0].endswith("hello x=1\n")
    assert answers[1].rstrip().endswith("Content-Length: 7")  # HEAD: the length, no body
    assert "Allow: GET, HEAD" in answers[2]


def test_bodies_are_bounded_declared_or_chunked():
    async def go():
        srv = await _serve()
        try:
            ok = await _exchange(srv.port, b"POST /echo HTTP/1.1\r\nHost: a\r\n"
                                 b"Content-Length: 5\r\nConnection: close\r\n\r\nabcde")
            declared = await _exchange(srv.port, b"POST /echo HTTP/1.1\r\nHost: a\r\n"
                                       b"Content-Length: 5000\r\n\r\n" + b"x" * 100)
            chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"
            chunked = await _exchange(srv.port, b"POST /echo HTTP/1.1\r\nHost: a\r\n"
                                      b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 3)
            return ok, declared, chunked
        finally:
            await srv.close()
    ok, declared, chunked = run(go())
    assert ok.startswith(b"HTTP/1.1 200") and ok.endswith(b"abcde")
    for out in (declared, chunked):  # answered, and the connection closed after it
        assert out.startswith(b"HTTP/1.1 413") and b"Connection: close" in out


def test_oversized_and_malformed_heads_get_one_answer_and_a_close():
    async def go():
        srv = await _serve()
        try:
            big = await _exchange(srv.port, b"GET /hello HTTP/1.1\r\nHost: a\r\nX: "
                                  + b"y" * 40000 + b"\r\n\r\n")
            bad = await _exchange(srv.port, b"GET /hello HTTP/1.1\r\nHost: a\r\n"
                                  b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n")
            junk = await _exchange(srv.port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\r\n\r\n")
            return big, bad, junk
        finally:
            await srv.close()
    big, bad, junk = run(go())
    assert big.startswith(b"HTTP/1.1 431"), big[:100]
    assert bad.startswith(b"HTTP/1.1 400"), bad[:100]
    assert junk.startswith(b"HTTP/1.1 400"), junk[:100]


def test_a_request_trickled_too_slowly_is_dropped(monkeypatch):
    monkeypatch.setattr(server, "REQUEST_TIMEOUT", 0.5)

    async def go():
        srv = await _serve()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            writer.write(b"GET /hello HTTP/1.1\r\n")
            for _ in range(10):  # one header byte every 0.2 s: never a whole request
                await asyncio.sleep(0.2)
                writer.write(b"X")
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
            got = b""
            with contextlib.suppress(ConnectionError):  # closed under the writer: the same
                got = await asyncio.wait_for(reader.read(100), 5)
            writer.close()
            return got
        finally:
            await srv.close()
    assert run(go()) == b""  # closed without an answer


@pytest.mark.parametrize("limit", [3])
def test_connections_beyond_the_limit_are_closed(monkeypatch, limit):
    monkeypatch.setattr(server, "MAX_CONNECTIONS", limit)

    async def go():
        srv = await _serve()
        try:
            idle = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(limit)]
            await asyncio.sleep(0.2)
            refused = await _exchange(srv.port, b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n", 2)
            for _, w in idle:
                w.close()
            await asyncio.sleep(0.2)
            served = await _exchange(srv.port, b"GET /hello HTTP/1.1\r\nHost: a\r\n"
                                     b"Connection: close\r\n\r\n")
            return refused, served
        finally:
            await srv.close()
    refused, served = run(go())
    assert refused == b"" and served.startswith(b"HTTP/1.1 200")


def test_the_connection_sweep_sleeps_while_no_connection_is_open(monkeypatch):
    """The sweep times out connections: with none open it has nothing to do, and the idle
    daemon is not woken for it twice a second."""
    from gpuwatch.exporter import listener

    swept = []
    real = listener.Listener.sweep
    monkeypatch.setattr(listener.Listener, "sweep", lambda self: swept.append(
        len(self._conns)) or real(self))

    async def go():
        srv = await _serve()
        try:
            await asyncio.sleep(4 * listener.SWEEP_SECONDS)
            idle = len(swept)
            _, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            await asyncio.sleep(4 * listener.SWEEP_SECONDS)
            busy = [n for n in swept[idle:] if n]
            writer.close()
            return idle, busy
        finally:
            await srv.close()
    idle, busy = run(go())
    assert idle == 0 and len(busy) >= 2  # swept only while a connection is open
