"""The listening sockets and the descriptor budget they are served under."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import resource
import socket

log = logging.getLogger("gpuwatch.http")

# Kept below RLIMIT_NOFILE for the daemon's own work: engine scrapes, probe reads,
# snapshots, logs, NVML.
RESERVED_FDS = 256
BACKLOG = 256
# asyncio gives every TLS connection a 256 KiB read buffer at accept, before the handshake
# (asyncio.sslproto.SSLProtocol.max_size, the most one read() returns): 1024 idle
# connections were 280 MB. Two TLS records' worth reads just as well, in more calls.
TLS_READ_BYTES = 32 * 1024


def smaller_tls_buffers() -> None:
    from asyncio import sslproto

    if getattr(sslproto.SSLProtocol, "max_size", 0) > TLS_READ_BYTES:
        sslproto.SSLProtocol.max_size = TLS_READ_BYTES


def bind(host: str | None, port: int) -> list[socket.socket]:
    """Listening sockets for every address of host (None: every interface), as asyncio's
    create_server makes them: SO_REUSEADDR, IPv6 sockets IPv6-only. Raises OSError."""
    # An ASCII name as bytes: a str goes through the idna codec, which imports
    # unicodedata and stringprep into the daemon for good.
    name = host.encode("ascii") if host is not None and host.isascii() else host
    infos = socket.getaddrinfo(name, port, socket.AF_UNSPEC, socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:  # a family this host lacks (IPv6 turned off)
                continue
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(errno.EAFNOSUPPORT, "no address to listen on")
    return socks


def descriptor_cap(wanted: int) -> int:
    """How many client connections fit below RLIMIT_NOFILE with RESERVED_FDS (or half the
    limit, when it is small) kept for the daemon's own files. The soft limit is raised
    towards the hard one first, as far as the wanted connections need."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64
    need = wanted + RESERVED_FDS + in_use
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return wanted
    reserve = min(RESERVED_FDS, soft // 2)
    cap = max(1, min(wanted, soft - reserve - in_use))
    if cap < wanted:
        log.warning("http: at most %d connections, not max_connections = %d: the descriptor "
                    "limit is %d and %d are kept for the daemon's own work (raise "
                    "LimitNOFILE=, or ulimit -n)", cap, wanted, soft, reserve + in_use)
    return cap
