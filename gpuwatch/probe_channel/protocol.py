"""What a probe and the daemon exchange through the probe directory, and the careful file I/O
both sides use.

Layout: `<probe dir>/<uid>/` (mode 0700, owned by uid; made by a root daemon, or by the
probe where the probe directory is its user's own) holds, per process of that user,
`<pid>.json` (the stats record), `req-<pid>-<id>.json` (a request from the daemon) and
`res-<pid>-<id>.json` (the probe's answer). Temporary files start with a dot.

The daemon may run as root and reads and writes inside directories other users own, so every
open goes through a directory descriptor, refuses symlinks and anything but regular files,
checks the owner on the opened descriptor (no check-then-use race) and caps sizes.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Callable
from typing import BinaryIO

import msgspec

from gpuwatch.model import ProbeSample

FORMAT = "gpuwatch-probe"
VERSION = 1
ACTIONS = ("flush", "snapshot")
MAX_RECORD_BYTES = 256 * 1024
MAX_MESSAGE_BYTES = 64 * 1024

REQUEST_RE = re.compile(r"req-(\d+)-([0-9a-f]{8,64})\.json")
REQUEST_ID_RE = re.compile(r"[0-9a-f]{8,64}")


class ProbeRecord(msgspec.Struct, kw_only=True):
    """The content of `<pid>.json`: one sample per CUDA device the process uses."""

    format: str = FORMAT
    version: int = VERSION
    pid: int
    t: float
    create_time: float | None = None
    # When the probe means to publish next, so a reader can tell a stale record.
    interval_seconds: float | None = None
    # ok | no_torch | cuda_not_initialized | error: ...
    status: str = "ok"
    torch_version: str = ""
    samples: list[ProbeSample] = []


class Request(msgspec.Struct, kw_only=True):
    id: str
    pid: int
    action: str
    t: float
    params: dict = {}


record_decoder = msgspec.json.Decoder(ProbeRecord)
request_decoder = msgspec.json.Decoder(Request)


def stats_name(pid: int) -> str:
    return f"{pid}.json"


def request_name(pid: int, request_id: str) -> str:
    return f"req-{pid}-{request_id}.json"


def result_name(pid: int, request_id: str) -> str:
    return f"res-{pid}-{request_id}.json"


def snapshot_name(pid: int, request_id: str) -> str:
    """The one name a snapshot answering request_id may have, in the probe's own directory."""
    return f"gpuwatch-probe-{pid}-{request_id}.pickle"


def token_hex(nbytes: int) -> str:
    """What secrets.token_hex returns (os.urandom, hex), without the modules secrets
    imports into the daemon (random, base64, hmac)."""
    return os.urandom(nbytes).hex()


def new_request_id() -> str:
    return token_hex(8)


def open_dir(path: str, dir_fd: int | None = None) -> int:
    """A descriptor on a directory; raises OSError (ELOOP / ENOTDIR) for a symlink or file."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, dir_fd=dir_fd)


def write_atomic(dir_fd: int, name: str, data: bytes | Callable[[BinaryIO], object],
                 mode: int = 0o600, sync: bool = True) -> None:
    """Write name in the directory: a fresh temporary file, fsync, then rename over name,
    so readers see the old or the new content, never a part. data: bytes, or a function
    that writes into the open file (large pickles are streamed)."""
    tmp = f".{name}.{token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, mode)  # whatever the umask
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            if sync:
                os.fsync(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        unlink_quietly(dir_fd, tmp)
        raise


def open_regular(dir_fd: int, name: str, max_bytes: int) -> tuple[int, os.stat_result]:
    """(descriptor, status) of a regular file in the directory, opened for reading; OSError or
    ValueError when it is a symlink, not a regular file, or larger than max_bytes."""
    # O_NONBLOCK: a FIFO planted under a probe's name must not hang the reader.
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                 dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{name}: not a regular file")
        if st.st_size > max_bytes:
            raise ValueError(f"{name}: {st.st_size} bytes, more than {max_bytes}")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(dir_fd: int, name: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The content and status of a regular file in the directory; OSError or ValueError when
    it is a symlink, not a regular file, or larger than max_bytes."""
    fd, st = open_regular(dir_fd, name, max_bytes)
    try:
        chunks = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise ValueError(f"{name}: more than {max_bytes} bytes")
        return data, st
    finally:
        os.close(fd)


def unlink_quietly(dir_fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def ensure_base(base: str) -> None:
    """Create the probe directory if needed: as root 0755 (users may enter, only root may add:
    the daemon makes each user's directory, so nobody can take another's name); private to
    its user otherwise. A root directory left world-writable by an older version is closed."""
    root = os.geteuid() == 0
    if not os.path.isdir(base):
        parent = os.path.dirname(os.path.abspath(base))
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o755 if root else 0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, 0o700)
    if root:
        fd = open_dir(base)
        try:
            st = os.fstat(fd)
            if st.st_uid == 0 and stat.S_IMODE(st.st_mode) != 0o755:
                os.fchmod(fd, 0o755)
        finally:
            os.close(fd)
