"""The daemon's side of the request channel: ask the probe in a process to act.

A request is a file `req-<pid>-<id>.json` written atomically into the probe's directory
(`<probe dir>/<uid of the process>/`); the probe takes it, acts, and writes
`res-<pid>-<id>.json`. The probe only obeys request files owned by root, by its own uid or by
a uid it was configured to trust; the daemon only believes answers owned by the process's
user. A snapshot is never taken from a path the probe names: the probe writes it under the
one name the daemon expects in its own directory, and copy_out() copies it from there through
the directory's descriptor (no symlink followed, the owner checked on the opened file) into a
new file of the daemon's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import time
from typing import Any

import msgspec
import psutil

from gpuwatch.probe_channel import protocol

_encoder = msgspec.json.Encoder()


class ProbeUnavailableError(OSError):
    """No probe publishes for that pid (none loaded, process gone, or not ours to reach)."""


def _process_uids(pid: int) -> list[int]:
    try:
        uids = psutil.Process(pid).uids()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        raise ProbeUnavailableError(f"pid {pid}: no such process") from None
    except psutil.Error as exc:
        raise ProbeUnavailableError(f"pid {pid}: {exc}") from None
    return list(dict.fromkeys((uids.effective, uids.real, uids.saved)))


def _open_probe_dir(probe_dir: str, pid: int) -> tuple[int, int]:
    """(descriptor on the probe's user directory, that uid) for the probe in pid."""
    for uid in _process_uids(pid):
        try:
            fd = protocol.open_dir(os.path.join(probe_dir, str(uid)))
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid == uid:
                rec = os.stat(protocol.stats_name(pid), dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(rec.st_mode) and rec.st_uid == uid:
                    return fd, uid
        except OSError:
            pass
        os.close(fd)
    raise ProbeUnavailableError(f"no probe publishes for pid {pid} in {probe_dir}")


def send_request(probe_dir: str, pid: int, action: str,
                 params: dict[str, Any] | None = None) -> str:
    """Ask the probe in pid to carry out action ("flush" or "snapshot"); returns the
    request id for wait_result. Raises ValueError for a bad request, ProbeUnavailableError
    (an OSError) when no probe publishes for pid."""
    if action not in protocol.ACTIONS:
        raise ValueError(f"unknown probe action {action!r} (one of {', '.join(protocol.ACTIONS)})")
    if params is not None and not isinstance(params, dict):
        raise ValueError("params must be a dict")
    request_id = protocol.new_request_id()
    try:
        data = _encoder.encode(protocol.Request(id=request_id, pid=pid, action=action,
                                                t=time.time(), params=params or {}))
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValueError(f"params cannot be sent as JSON: {exc}") from None
    if len(data) > protocol.MAX_MESSAGE_BYTES:
        raise ValueError(f"request of {len(data)} bytes is too large")
    fd, _uid = _open_probe_dir(probe_dir, pid)
    try:
        # 0644: a root daemon owns the file, the probe's user must read it; the directory
        # (0700, the probe user's) keeps everyone else out.
        protocol.write_atomic(fd, protocol.request_name(pid, request_id), data, mode=0o644)
    finally:
        os.close(fd)
    return request_id


def _take_result(probe_dir: str, pid: int, request_id: str) -> dict[str, Any] | None:
    fd, uid = _open_probe_dir(probe_dir, pid)
    try:
        name = protocol.result_name(pid, request_id)
        try:
            data, st = protocol.read_regular(fd, name, protocol.MAX_MESSAGE_BYTES)
        except FileNotFoundError:
            return None
        protocol.unlink_quietly(fd, name)
        if st.st_uid != uid:
            raise ValueError(f"answer for pid {pid} is owned by uid {st.st_uid}, not {uid}")
        try:
            result = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            raise ValueError(f"probe in pid {pid} answered invalid JSON: {exc}") from None
        if not isinstance(result, dict):
            raise ValueError(f"probe in pid {pid} answered {type(result).__name__}")
        name = result.get("name")
        if name is not None and name != protocol.snapshot_name(pid, request_id):
            result.update(ok=False, name=None, error=f"snapshot under another name: {name!r}")
        return result
    finally:
        os.close(fd)


def copy_out(probe_dir: str, pid: int, request_id: str, dest: str, max_bytes: int) -> int:
    """Copy the snapshot the probe in pid wrote for request_id into dest, a new owner-only
    file of ours, and remove the probe's file. Returns the bytes copied.

    Only `<probe dir>/<uid>/<the expected name>` is opened, through the directory's
    descriptor and without following a symlink; it must be a regular file with one link,
    owned by the process's user, at most max_bytes long. Raises OSError / ValueError."""
    if not protocol.REQUEST_ID_RE.fullmatch(request_id):
        raise ValueError(f"not a request id: {request_id!r}")
    name = protocol.snapshot_name(pid, request_id)
    dir_fd, uid = _open_probe_dir(probe_dir, pid)
    try:
        return copy_named(dir_fd, uid, name, dest, max_bytes)
    finally:
        protocol.unlink_quietly(dir_fd, name)  # a name in the probe's own directory only
        os.close(dir_fd)


def open_user_dir(probe_dir: str, uid: int) -> int:
    """A descriptor on `<probe dir>/<uid>/`, which must be uid's (no symlink followed)."""
    fd = protocol.open_dir(os.path.join(probe_dir, str(uid)))
    try:
        owner = os.fstat(fd).st_uid
        if owner != uid:
            raise ValueError(f"{probe_dir}/{uid}: owned by uid {owner}, not {uid}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def copy_named(dir_fd: int, uid: int, name: str, dest: str, max_bytes: int) -> int:
    """Copy `name` in a user directory (opened by copy_out, or by open_user_dir for an OOM
    record, whose process may have exited) into dest, a new owner-only file of ours: a
    regular file with one link, owned by uid, within max_bytes. The caller removes the
    probe's file."""
    src, st = protocol.open_regular(dir_fd, name, max_bytes)
    try:
        if st.st_uid != uid:
            raise ValueError(f"{name}: owned by uid {st.st_uid}, not {uid}")
        if st.st_nlink != 1:
            raise ValueError(f"{name}: {st.st_nlink} links (a link to another file?)")
        return _copy(src, dest, max_bytes)
    finally:
        os.close(src)


def _extents(fd: int, max_bytes: int):
    """(start, end) of each run of data in the file, holes skipped (SEEK_DATA/SEEK_HOLE): a
    sparse file of the user's costs root only the bytes it holds. Where the filesystem
    cannot tell, the whole file is one run."""
    pos = 0
    while True:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data past pos
                return
            if pos == 0 and exc.errno == errno.EINVAL:  # no SEEK_DATA here
                yield 0, max_bytes + 1
                return
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end
        pos = end


def _copy(src: int, dest: str, max_bytes: int) -> int:
    """Copy the data of src into the new file dest, holes left holes; the bytes written."""
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                  0o600)
    copied = length = 0
    try:
        os.fchmod(out, 0o600)  # whatever the umask
        for start, end in _extents(src, max_bytes):
            pos = start
            while pos < end and (chunk := os.pread(src, min(1 << 20, end - pos), pos)):
                pos += len(chunk)
                if pos > max_bytes:
                    raise ValueError(f"snapshot grew past {max_bytes} bytes while copied")
                view, at = memoryview(chunk), pos - len(chunk)
                while view:
                    n = os.pwrite(out, view, at)
                    view, at = view[n:], at + n
                copied += len(chunk)
            length = max(length, pos)
        length = max(length, os.fstat(src).st_size)
        if length > max_bytes:
            raise ValueError(f"snapshot grew past {max_bytes} bytes while copied")
        os.ftruncate(out, length)  # a hole at the end stays one
        os.fsync(out)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(dest)
        raise
    os.close(out)
    return copied


def _withdraw(probe_dir: str, pid: int, request_id: str) -> None:
    try:
        fd, _uid = _open_probe_dir(probe_dir, pid)
    except OSError:
        return
    try:
        protocol.unlink_quietly(fd, protocol.request_name(pid, request_id))
    finally:
        os.close(fd)


async def wait_result(probe_dir: str, pid: int, request_id: str, timeout: float) -> dict:
    """The probe's answer to request_id: {"ok": True, "released_bytes": …} for a flush,
    {"ok": True, "path": …, "segments": …} for a snapshot, {"ok": False, "error": …} when
    it could not act. Raises TimeoutError (and withdraws the request) after timeout
    seconds; ProbeUnavailableError when the process or its probe went away."""
    if not protocol.REQUEST_ID_RE.fullmatch(request_id):
        raise ValueError(f"not a request id: {request_id!r}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.02
    while True:
        result = _take_result(probe_dir, pid, request_id)
        if result is not None:
            return result
        left = deadline - loop.time()
        if left <= 0:
            _withdraw(probe_dir, pid, request_id)
            raise TimeoutError(f"probe in pid {pid} did not answer within {timeout:g}s")
        await asyncio.sleep(min(delay, left))
        delay = min(delay * 1.5, 0.2)
