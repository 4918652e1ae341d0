"""The daemon's side of the request channel: ask the probe in a process to act.

A request is a file `req-<pid>-<id>.json` written atomically into the probe's directory
(`<probe dir>/<uid of the process>/`); the probe takes it, acts, and writes
`res-<pid>-<id>.json`. The probe only obeys request files owned by root, by its own uid or by
a uid it was configured to trust; the daemon only believes answers owned by the process's
user, and checks a snapshot's path before handing it on.
"""

from __future__ import annotations

import asyncio
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
        if result.get("path") is not None:
            _check_written_file(result, uid)
        return result
    finally:
        os.close(fd)


def _check_written_file(result: dict[str, Any], uid: int) -> None:
    """A snapshot path must be a regular file of the probe's user, not a link it planted
    to make the daemon move or read something else."""
    path = result.get("path")
    try:
        if not isinstance(path, str) or not os.path.isabs(path):
            raise ValueError("not an absolute path")
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_uid != uid:
            raise ValueError(f"owned by uid {st.st_uid}, not {uid}")
    except (OSError, ValueError) as exc:
        result.update(ok=False, path=None, error=f"snapshot file {path!r} refused: {exc}")


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
