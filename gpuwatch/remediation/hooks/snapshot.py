"""Snapshot: always the NVML state of the GPU and its processes as JSON; and, through the
probe in the process, the allocator snapshot pickle (optionally with the recorded allocation
history) that PyTorch's memory visualizer opens.

Files are owner-only, in an owner-only directory. Each file's name says whose process it is
about (`uid<uid>`, or `host` for a whole GPU), and a snapshot makes room only by deleting
older files of the same owner: one user cannot erase another's. Each user's files are capped
(max_user_bytes), each snapshot too (max_snapshot_bytes), and a snapshot that would take the
directory past max_total_bytes with other users' files is refused. The probe's pickle is
copied out of the probe's own directory (gpuwatch.probe_channel.requests.copy_out), never
moved from a path it names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil

from gpuwatch.remediation.hooks import HookFailed, Target, probe_channel
from gpuwatch.safetext import encode_json

_encoder = msgspec.json.Encoder()

PREFIX = "gpuwatch-"
HOST = "host"  # whole-GPU snapshots, and processes whose user could not be read
_OWNER = re.compile(r"-(uid\d{1,10}|host)(?:-\d{1,3})?-(?:nvml\.json|allocator\.pickle|oom\.json|"
                    r"oom-history\.pickle)$")


def prepare_dir(path: str | os.PathLike) -> Path:
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = d.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        d.chmod(0o700)
    return d


def owner_of(pid: int | None, create_time: float | None = None) -> str:
    """Whose files a snapshot of pid are: `uid<the user running it>`, else `host` (no
    process, or another one under its pid since the sample)."""
    if pid is None:
        return HOST
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return HOST
        return f"uid{proc.uids().real}"
    except psutil.Error:
        return HOST


def file_stem(t: float, target: Target, owner: str = HOST) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"
    gpu = (target.gpu_uuid or "nogpu").removeprefix("GPU-")[:8]
    who = f"pid{target.pid}" if target.pid is not None else "gpu"
    return f"{PREFIX}{stamp}-{gpu}-{who}-{owner}"


def state_record(snap: Any, target: Target, event: dict[str, Any], t: float) -> dict[str, Any]:
    """What NVML last said about the target's GPU and processes, and what gpuwatch derived."""
    tick = getattr(snap, "tick", None)
    derived = getattr(snap, "derived", None)
    gpu = next((g for g in getattr(tick, "gpus", ()) if g.uuid == target.gpu_uuid), None)
    rec: dict[str, Any] = {
        "format": "gpuwatch-nvml-state", "version": 1, "t": t,
        "sample_t": getattr(tick, "t", None),
        "target": dataclasses.asdict(target), "event": event,
        "gpu": msgspec.to_builtins(gpu) if gpu is not None else None,
    }
    if derived is not None and target.gpu_uuid:
        sig = derived.gpus.get(target.gpu_uuid)
        rec["gpu_signals"] = dataclasses.asdict(sig) if sig is not None else None
        rec["process_signals"] = {
            str(pid): dataclasses.asdict(ps)
            for (uuid, pid), ps in derived.processes.items() if uuid == target.gpu_uuid
        }
    pids = {p.pid for p in gpu.processes} if gpu is not None else set()
    rec["probes"] = [msgspec.to_builtins(p) for p in getattr(tick, "probes", ()) if p.pid in pids]
    return rec


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(directory: Path) -> list[tuple[float, str, int, str | None]]:
    """(mtime, name, bytes, owner) of the gpuwatch-* files; owner None: a file from before
    owners were named. Bytes are the larger of the length and the blocks it holds."""
    out = []
    for entry in os.scandir(directory):
        if entry.name.startswith(PREFIX) and entry.is_file(follow_symlinks=False):
            st = entry.stat(follow_symlinks=False)
            m = _OWNER.search(entry.name)
            out.append((st.st_mtime, entry.name, max(st.st_size, st.st_blocks * 512),
                        m[1] if m else None))
    return out


def room(directory: Path, owner: str, max_total_bytes: int, max_user_bytes: int) -> int:
    """Bytes a new snapshot of owner's may take: its share, less what other owners hold of
    the total (the owner's own older files, and files without an owner, may be deleted)."""
    others = sum(size for _, _, size, o in _files(directory) if o is not None and o != owner)
    return min(max_user_bytes, max_total_bytes - others)


def enforce_cap(directory: Path, max_total_bytes: int, keep: set[Path] = frozenset(),
                owner: str | None = None, max_user_bytes: int | None = None) -> list[str]:
    """Delete files until the total fits and owner's files fit their share: files without
    an owner first, then owner's own, oldest first; never another owner's. Returns the
    names deleted."""
    files = _files(directory)
    total = sum(f[2] for f in files)
    share = max_user_bytes if max_user_bytes is not None else max_total_bytes
    mine = sum(f[2] for f in files if owner is not None and f[3] == owner)
    deleted = []
    candidates = sorted(f for f in files if f[3] is None)
    candidates += sorted(f for f in files if owner is not None and f[3] == owner)
    for _mtime, name, size, o in candidates:
        if total <= max_total_bytes and mine <= share:
            break
        if directory / name in keep or (o is None and total <= max_total_bytes):
            continue
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
        total -= size
        mine -= size if o is not None else 0
        deleted.append(name)
    return deleted


def adopt(copies: list[tuple[str, Any]], target: Target, t: float, *, directory: str,
          max_total_bytes: int, owner: str | None = None
          ) -> tuple[dict[str, str], list[str], dict[str, str]]:
    """Bring files a probe wrote (an OOM record and its history pickle) into the snapshot
    directory, named and capped as snapshots are. copies: (suffix, copy) pairs, where
    copy(dest) copies one file into the new file dest with the probe channel's checks
    (gpuwatch.probe_channel.requests.copy_named). Blocking. Returns (suffix -> path of what
    was adopted, names deleted for the cap, suffix -> why a file was not adopted). owner:
    whose files they are (`uid<uid>`; default: the target process's user), whose older
    files alone make room for them."""
    d = prepare_dir(directory)
    owner = owner or owner_of(target.pid, target.create_time)
    stem = file_stem(t, target, owner)
    adopted: dict[str, str] = {}
    failed: dict[str, str] = {}
    for suffix, copy in copies:
        for n in range(1000):  # two records of one process stamped the same microsecond
            dest = d / (f"{stem}-{n}-{suffix}" if n else f"{stem}-{suffix}")
            try:
                copy(str(dest))
            except FileExistsError:
                continue
            except (OSError, ValueError) as exc:
                failed[suffix] = str(exc)[:300]
            else:
                adopted[suffix] = str(dest)
            break
    deleted = enforce_cap(d, max_total_bytes, keep={Path(p) for p in adopted.values()},
                          owner=owner)
    return adopted, deleted, failed


async def take(snap: Any, target: Target, event: dict[str, Any], *, directory: str,
               max_total_bytes: int, probe_dir: str, has_probe: bool, history: bool,
               timeout: float, t: float, max_user_bytes: int | None = None,
               max_snapshot_bytes: int | None = None) -> dict:
    d = prepare_dir(directory)
    owner = owner_of(target.pid, target.create_time)
    share = min(max_user_bytes or max_total_bytes, max_total_bytes)
    stem = file_stem(t, target, owner)
    detail: dict[str, Any] = {"dir": str(d), "owner": owner}
    data = encode_json(_encoder, state_record(snap, target, event, t))
    free = room(d, owner, max_total_bytes, share)
    if len(data) > free:
        raise HookFailed(f"snapshot refused: {d} holds other users' snapshots up to its "
                         f"max_total_bytes ({max_total_bytes}); {owner}'s are never deleted "
                         "to make room for another's", detail)
    for n in range(1000):  # two snapshots of one target in the same microsecond
        if n:
            stem = f"{file_stem(t, target, owner)}-{n}"
        state = d / f"{stem}-nvml.json"
        try:
            write_private(state, data)
            break
        except FileExistsError:
            continue
    else:
        raise HookFailed(f"no free file name for {stem} in {d}")
    detail["nvml_state"] = str(state)
    written = {state}
    if target.pid is not None and has_probe:
        try:
            res = await probe_channel.request(probe_dir, target.pid, "snapshot",
                                              {"history": history}, timeout)
            if res.get("ok"):
                path = d / f"{stem}-allocator.pickle"
                cap = min(max_snapshot_bytes or share, share, free - len(data))
                await probe_channel.copy_snapshot(probe_dir, target.pid, res["request_id"],
                                                  str(path), cap)
        except HookFailed as exc:
            detail["probe_error"] = str(exc)
        else:
            if res.get("ok"):
                written.add(path)
                detail["allocator_snapshot"] = str(path)
                # What the probe says is the user's text: typed and cut short before it is
                # audited.
                segments = res.get("segments")
                detail["segments"] = segments if type(segments) is int else None
                if history:
                    detail["history"] = bool(res.get("history", True))
                if res.get("note"):
                    detail["probe_note"] = str(res["note"])[:300]
            else:
                detail["probe_error"] = str(res.get("error") or "probe wrote no snapshot")[:300]
    elif target.pid is not None:
        detail["probe"] = "none in this process: NVML state only"
    deleted = enforce_cap(d, max_total_bytes, keep=written, owner=owner, max_user_bytes=share)
    if deleted:
        detail["deleted_for_cap"] = deleted
    if "probe_error" in detail:
        # The NVML state is there, but what was asked of the probe is not.
        raise HookFailed(f"allocator snapshot failed: {detail['probe_error']} "
                         "(NVML state written)", detail)
    return detail
