"""The daemon's reader of what in-process probes publish (gpuwatch.probe).

`<probe dir>/<uid>/<pid>.json` is believed only when the directory and the file belong to
uid and the live process pid belongs to uid too, so one user cannot publish numbers for
another user's process. Stale records, records of dead processes (or of an earlier process
that had the same pid) and garbage are skipped; nothing here raises on bad input.
"""

from __future__ import annotations

import os
import re

import msgspec
import psutil

import gpuwatch.probe_channel.protocol as protocol
from gpuwatch.model import ProbeSample

_STATS_RE = re.compile(r"(\d+)\.json")
# psutil derives create time from boot time + start ticks: equal in every reader, give or take.
_CREATE_TIME_SLACK = 1.0


def prepare_probe_dir(probe_dir: str) -> None:
    """Create the probe directory for probes to publish into; as root, shared and sticky
    (every user's probes add their own 0700 directory inside). Raises OSError."""
    protocol.ensure_base(probe_dir)


def read_probes(probe_dir: str, now: float, *, stale_after: float = 30.0,
                problems: list[str] | None = None, prune: bool = True) -> list[ProbeSample]:
    """Every believable probe sample in probe_dir, ordered by (pid, device).

    now: the daemon's wall clock (records carry the probe's time.time()).
    problems: when given, receives one line per record that was refused and why.
    prune: delete records whose process is gone (where permissions allow).
    """
    notes: list[str] = problems if problems is not None else []
    try:
        base_fd = protocol.open_dir(probe_dir)
    except FileNotFoundError:
        return []
    except OSError as exc:
        notes.append(f"{probe_dir}: {exc.strerror or exc}")
        return []
    out: list[ProbeSample] = []
    try:
        for name in os.listdir(base_fd):
            if name.isdigit():
                out += _read_user_dir(base_fd, probe_dir, int(name), now, stale_after,
                                      notes, prune)
    except OSError as exc:
        notes.append(f"{probe_dir}: {exc.strerror or exc}")
    finally:
        os.close(base_fd)
    out.sort(key=lambda s: (s.pid, -1 if s.device is None else s.device))
    return out


def _read_user_dir(base_fd: int, probe_dir: str, uid: int, now: float, stale_after: float,
                   notes: list[str], prune: bool) -> list[ProbeSample]:
    where = os.path.join(probe_dir, str(uid))
    try:
        fd = protocol.open_dir(str(uid), dir_fd=base_fd)
    except OSError as exc:
        notes.append(f"{where}: {exc.strerror or exc}")
        return []
    out: list[ProbeSample] = []
    try:
        owner = os.fstat(fd).st_uid
        if owner != uid:
            notes.append(f"{where}: owned by uid {owner}, not {uid}: ignored")
            return []
        for name in os.listdir(fd):
            m = _STATS_RE.fullmatch(name)
            if m is None:
                continue
            try:
                out += _read_record(fd, name, int(m.group(1)), uid, now, stale_after, prune)
            except _Refused as exc:
                notes.append(f"{where}/{name}: {exc}")
    finally:
        os.close(fd)
    return out


class _Refused(Exception):
    pass


def _read_record(fd: int, name: str, pid: int, uid: int, now: float, stale_after: float,
                 prune: bool) -> list[ProbeSample]:
    try:
        data, st = protocol.read_regular(fd, name, protocol.MAX_RECORD_BYTES)
    except FileNotFoundError:
        return []  # the probe stopped between listing and reading
    except (OSError, ValueError) as exc:
        raise _Refused(str(exc)) from None
    if st.st_uid != uid:
        raise _Refused(f"owned by uid {st.st_uid}, not {uid}")
    try:
        rec = protocol.record_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _Refused(f"not a probe record: {exc}") from None
    if rec.format != protocol.FORMAT or rec.pid != pid:
        raise _Refused("not a probe record for this pid")

    alive, why = _process_matches(pid, uid, rec.create_time)
    if not alive:
        if prune:
            protocol.unlink_quietly(fd, name)
        if why:
            raise _Refused(why)
        return []
    limit = max(stale_after, 3 * (rec.interval_seconds or 0.0))
    if now - rec.t > limit or rec.t - now > limit:
        return []  # not updated lately (a hung or stopped probe): no numbers rather than old
    out = []
    for s in rec.samples:
        if s.pid != pid:
            raise _Refused(f"sample for pid {s.pid} in the record of pid {pid}")
        if s.t is None:
            s.t = rec.t
        if s.create_time is None:
            s.create_time = rec.create_time
        out.append(s)
    return out


def _process_matches(pid: int, uid: int, create_time: float | None) -> tuple[bool, str]:
    """(is the record's process alive and uid's, reason to report when not merely gone)."""
    try:
        proc = psutil.Process(pid)
        started = proc.create_time()
        uids = proc.uids()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False, ""
    except psutil.Error as exc:
        return False, f"pid {pid}: {exc}"
    if create_time is not None and abs(started - create_time) > _CREATE_TIME_SLACK:
        return False, ""  # the pid now belongs to a newer process
    if uid not in (uids.real, uids.effective, uids.saved):
        return False, f"pid {pid} belongs to uid {uids.effective}, not {uid}"
    return True, ""
