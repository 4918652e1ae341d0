"""Reads from a /proc tree (the host's, or another one mounted elsewhere such as /host/proc),
bounded: a hostile or huge file costs at most a fixed number of bytes, and a vanished or
unreadable process is simply unknown."""

from __future__ import annotations

import os

MAX_PID = 4_194_304  # the kernel's PID_MAX_LIMIT on 64-bit
MAX_CGROUP_BYTES = 64 * 1024
# The environment of a process is at most ARG_MAX-ish; stop reading well before that.
MAX_ENVIRON_BYTES = 512 * 1024
_SLURM_JOB = b"SLURM_JOB_ID="


def valid_pid(pid: int) -> bool:
    return isinstance(pid, int) and 0 < pid <= MAX_PID


def _read(path: str, limit: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        chunks, size = [], 0
        while size < limit:
            chunk = os.read(fd, min(65536, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_cgroup(proc_root: str, pid: int) -> str | None:
    if not valid_pid(pid):
        return None
    data = _read(os.path.join(proc_root, str(pid), "cgroup"), MAX_CGROUP_BYTES)
    return None if data is None else data.decode("utf-8", "replace")


def slurm_job_from_environ(proc_root: str, pid: int) -> str | None:
    """SLURM_JOB_ID from the process's environment, and nothing else from it: the rest of
    the environment (tokens, passwords) is never kept, logged or returned."""
    if not valid_pid(pid):
        return None
    data = _read(os.path.join(proc_root, str(pid), "environ"), MAX_ENVIRON_BYTES)
    if not data:
        return None
    for entry in data.split(b"\0"):
        if entry.startswith(_SLURM_JOB):
            value = entry[len(_SLURM_JOB):]
            return value.decode() if value.isdigit() and len(value) <= 20 else None
    return None


def owner_uid(proc_root: str, pid: int) -> int | None:
    if not valid_pid(pid):
        return None
    try:
        return os.stat(os.path.join(proc_root, str(pid))).st_uid
    except OSError:
        return None
