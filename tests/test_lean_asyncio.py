"""asyncio imported without ssl (gpuwatch.lean_asyncio): a daemon without TLS never loads
OpenSSL, and the first `import ssl` afterwards makes asyncio's TLS whole again. Each case is a
fresh interpreter, since the point is the order of imports."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO, child_env
from tests.tls_certs import CA

ROUND_TRIP = textwrap.dedent("""
    import sys
    {first}
    import asyncio
    held_back = "ssl" not in sys.modules and "_ssl" not in sys.modules
    import ssl

    async def main(crt, key, ca):
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(crt, key)

        async def echo(reader, writer):
            writer.write((await reader.readline()).upper())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        client_ctx = ssl.create_default_context(cafile=ca)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx,
                                                       server_hostname="127.0.0.1")
        writer.write(b"over tls\\n")
        line = await reader.readline()
        peer = writer.get_extra_info("peercert") is not None
        writer.close()
        # and a connection upgraded in place (loop.start_tls, as HTTP proxies use)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await writer.start_tls(client_ctx, server_hostname="127.0.0.1")
        writer.write(b"upgraded\\n")
        line += await reader.readline()
        writer.close()
        server.close()
        await server.wait_closed()
        return line, peer

    line, peer = asyncio.run(main(*sys.argv[1:4]))
    print(held_back, *line.decode().split(), peer)
""")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = CA(d, "ca")
    crt, key = ca.issue("server", server=True)
    return [str(crt), str(key), str(ca.crt)]


def _run(first: str, pki) -> list[str]:
    r = subprocess.run([sys.executable, "-c", ROUND_TRIP.format(first=first), *pki], cwd=REPO,
                       env=child_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.parametrize("first", [
    "import gpuwatch.lean_asyncio",
    # asking where ssl is, without importing it, leaves the hand-back to the import
    "import gpuwatch.lean_asyncio, importlib.util; assert importlib.util.find_spec('ssl')",
])
def test_asyncio_comes_without_ssl_and_tls_works_once_ssl_is_imported(pki, first):
    assert _run(first, pki) == ["True", "OVER", "TLS", "UPGRADED", "True"]


def test_nothing_is_held_back_where_ssl_came_first(pki):
    assert _run("import ssl; import gpuwatch.lean_asyncio", pki) == [
        "False", "OVER", "TLS", "UPGRADED", "True"]


def test_the_daemons_own_process_holds_it_back():
    code = ("import sys, gpuwatch.serve, gpuwatch.daemon; "
            "print(sorted(m for m in ('ssl', '_ssl', 'hashlib', '_hashlib') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr
