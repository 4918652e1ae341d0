"""The daemon's reader of what in-process probes publish (gpuwatch.probe).

`<probe dir>/<uid>/<pid>.json` is believed only when the directory and the file belong to
uid and the live process pid belongs to uid too, so one user cannot publish numbers for
another user's process. Stale records, records of dead processes (or of an earlier process
that had the same pid) and garbage are skipped; nothing here raises on bad input.

One user's directory cannot slow the reader for everyone. The daemon (ProbeReader) opens
only `<uid>/<pid>.json` of the processes NVML shows on a GPU, by name: whatever else a user
keeps in their directory is never listed nor opened. Per user it reads at most
MAX_RECORDS_PER_USER records and MAX_BYTES_PER_USER bytes, off its event loop. The listing
reader (read_probes, for scripts and tests) is bounded too: at most MAX_ENTRIES_PER_USER names
looked at per user, entries that are not regular files and names of dead pids skipped (and
the latter pruned) without being opened, the process checked before its file is read.

As root the daemon owns the shared directory (0755, so no user can add to it) and makes each
user's `<uid>/` itself when a process of that user shows up on a GPU (ProbeReader): no user
can create, squat or remove another user's directory.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterable

import msgspec
import psutil

import gpuwatch.probe_channel.protocol as protocol
from gpuwatch.model import ProbeSample

log = logging.getLogger(__name__)

_STATS_RE = re.compile(r"([0-9]{1,10})\.json")
_UID_RE = re.compile(r"[0-9]{1,10}")
# psutil derives create time from boot time + start ticks: equal in every reader, give or take.
_CREATE_TIME_SLACK = 1.0
MAX_ENTRIES_PER_USER = 4096
MAX_RECORDS_PER_USER = 1024
MAX_BYTES_PER_USER = 32 * protocol.MAX_RECORD_BYTES
MAX_USERS = 4096
# a directory changed this recently is not taken for unchanged (see ProbeReader.read)
RACY_NS = 1_000_000_000


def prepare_probe_dir(probe_dir: str) -> None:
    """Create the probe directory for probes to publish into (as root: 0755 and root's; each
    user's directory is made by ensure_user_dir). Raises OSError."""
    protocol.ensure_base(probe_dir)


def ensure_user_dir(probe_dir: str, uid: int,
                    make_fs: Callable[[str, int], None] | None = None) -> None:
    """As root: make `<probe dir>/<uid>/` (0700, owned by uid) unless it is there and right.
    Something else under that name (left from when the directory was shared and sticky) is
    renamed out of the way first. make_fs(path, uid): called on a new directory while it is
    still root's (gpuwatch.sources.probe_fs mounts the user's own filesystem there). Raises
    OSError."""
    base_fd = protocol.open_dir(probe_dir)
    try:
        st = os.fstat(base_fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PermissionError(f"{probe_dir}: writable by others; not making user "
                                  "directories in it")
        name = str(uid)
        try:
            fd = protocol.open_dir(name, dir_fd=base_fd)
        except FileNotFoundError:
            fd = None
        except OSError:  # a symlink or a file under that name
            fd = None
            _set_aside(base_fd, name)
        if fd is not None:
            try:
                st = os.fstat(fd)
                if st.st_uid == uid:
                    if st.st_mode & 0o077:
                        os.fchmod(fd, 0o700)
                    return
            finally:
                os.close(fd)
            _set_aside(base_fd, name)
        os.mkdir(name, 0o700, dir_fd=base_fd)
        if make_fs is not None:  # through the descriptor: the path cannot be swapped
            make_fs(f"/proc/self/fd/{base_fd}/{name}", uid)
        fd = protocol.open_dir(name, dir_fd=base_fd)
        try:
            os.fchown(fd, uid, -1)
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
    finally:
        os.close(base_fd)


def _set_aside(base_fd: int, name: str) -> None:
    aside = f".squatted-{name}-{protocol.token_hex(4)}"
    os.rename(name, aside, src_dir_fd=base_fd, dst_dir_fd=base_fd)
    log.warning("probe directory: %s was not its user's; moved to %s", name, aside)


class ProbeReader:
    """The daemon's probe source: makes the directories of the users whose processes are on
    a GPU (as root), then reads. Blocking: run it off the event loop."""

    def __init__(self, probe_dir: str, user_fs=None) -> None:
        """user_fs: a gpuwatch.sources.probe_fs.UserFilesystems, to give each user's new
        directory a filesystem of its own."""
        self.probe_dir = probe_dir
        self.user_fs = user_fs
        self._uid_of: dict[int, int | None] = {}
        self._made: set[int] = set()
        # uid -> (its directory as seen before a read that found no record, the pids asked)
        self._empty: dict[int, tuple[tuple, frozenset[int]]] = {}

    def read(self, now: float, gpu_pids: Iterable[int], *, stale_after: float
             ) -> tuple[list[ProbeSample], list[str]]:
        """The probe samples of the processes on a GPU, and why any were refused."""
        problems: list[str] = []
        self._learn_uids(gpu_pids)
        if os.geteuid() == 0:
            self._make_dirs(problems)
            if self.user_fs is not None and self.user_fs.status():
                problems.insert(0, self.user_fs.status())
        by_uid: dict[int, list[int]] = {}
        for pid, uid in self._uid_of.items():
            if uid is not None:
                by_uid.setdefault(uid, []).append(pid)
        # A user's directory unchanged since a read that found none of these pids' records
        # still holds none: records are renamed in, and a rename changes the directory's
        # change time (which its owner cannot set back). One stat instead of a look per pid.
        seen = {uid: self._looks(uid) for uid in by_uid}
        todo = {uid: pids for uid, pids in by_uid.items()
                if seen[uid] is None or self._empty.get(uid) != (seen[uid], frozenset(pids))}
        known = len(problems)  # the filesystems' status line is no problem of the read
        samples = read_records_of(self.probe_dir, now, todo, stale_after=stale_after,
                                  problems=problems) if todo else []
        found = {s.pid for s in samples}
        # A change time this recent may hide a rename still to come within the same tick of
        # the kernel's coarse clock (a probe creates its temporary file, then renames it in):
        # such a directory is looked into again.
        settled = time.time_ns() - RACY_NS
        self._empty = {uid: (seen[uid], frozenset(pids)) for uid, pids in by_uid.items()
                       if seen[uid] is not None and len(problems) == known
                       and not found.intersection(pids) and seen[uid][3] < settled}
        return samples, problems

    def _looks(self, uid: int) -> tuple | None:
        """What a user's directory looks like now (None: not a plain directory here)."""
        try:
            st = os.lstat(os.path.join(self.probe_dir, str(uid)))
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, st.st_mode

    def _learn_uids(self, pids: Iterable[int]) -> None:
        pids = set(pids)
        # A pid's user is looked up once, while it is on a GPU; read_records_of checks the
        # live process against each record anyway.
        self._uid_of = {p: u for p, u in self._uid_of.items() if p in pids}
        for pid in pids - self._uid_of.keys():
            try:
                self._uid_of[pid] = psutil.Process(pid).uids().real
            except psutil.Error:
                self._uid_of[pid] = None

    def _make_dirs(self, problems: list[str]) -> None:
        for uid in {u for u in self._uid_of.values() if u is not None} - self._made:
            if len(self._made) >= MAX_USERS:
                break
            try:
                protocol.ensure_base(self.probe_dir)
                ensure_user_dir(self.probe_dir, uid,
                                self.user_fs.make if self.user_fs is not None else None)
            except OSError as exc:
                problems.append(f"{self.probe_dir}/{uid}: {exc.strerror or exc}")
                continue
            self._made.add(uid)


def read_records_of(probe_dir: str, now: float, pids_by_uid: dict[int, list[int]], *,
                    stale_after: float = 30.0, problems: list[str] | None = None
                    ) -> list[ProbeSample]:
    """The samples in `<probe dir>/<uid>/<pid>.json` for the given pids, each opened by name
    (nothing is listed), ordered by (pid, device)."""
    def read(base_fd: int, notes: list[str]) -> list[ProbeSample]:
        out: list[ProbeSample] = []
        for uid, pids in pids_by_uid.items():
            out += _read_named(base_fd, probe_dir, uid, pids, now, stale_after, notes)
        return out
    return _in_base(probe_dir, problems, read)


def read_probes(probe_dir: str, now: float, *, stale_after: float = 30.0,
                problems: list[str] | None = None, prune: bool = True) -> list[ProbeSample]:
    """Every believable probe sample in probe_dir, ordered by (pid, device).

    now: the daemon's wall clock (records carry the probe's time.time()).
    problems: when given, receives one line per record that was refused and why.
    prune: delete records whose process is gone (where permissions allow).
    """
    def read(base_fd: int, notes: list[str]) -> list[ProbeSample]:
        out: list[ProbeSample] = []
        live = _live_pids()
        users = [n for n in os.listdir(base_fd) if _UID_RE.fullmatch(n)][:MAX_USERS]
        for name in users:
            out += _read_user_dir(base_fd, probe_dir, int(name), now, stale_after, notes,
                                  prune, live)
        return out
    return _in_base(probe_dir, problems, read)


def _in_base(probe_dir: str, problems: list[str] | None,
             read: Callable[[int, list[str]], list[ProbeSample]]) -> list[ProbeSample]:
    """read(descriptor of the probe directory, notes), its samples sorted by (pid, device);
    nothing raised."""
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
        out = read(base_fd, notes)
    except OSError as exc:
        notes.append(f"{probe_dir}: {exc.strerror or exc}")
    finally:
        os.close(base_fd)
    out.sort(key=lambda s: (s.pid, -1 if s.device is None else s.device))
    return out


def _read_named(base_fd: int, probe_dir: str, uid: int, pids: list[int], now: float,
                stale_after: float, notes: list[str]) -> list[ProbeSample]:
    where = os.path.join(probe_dir, str(uid))
    try:
        fd = protocol.open_dir(str(uid), dir_fd=base_fd)
    except FileNotFoundError:
        return []
    except OSError as exc:
        notes.append(f"{where}: {exc.strerror or exc}")
        return []
    out: list[ProbeSample] = []
    try:
        owner = os.fstat(fd).st_uid
        if owner != uid:
            notes.append(f"{where}: owned by uid {owner}, not {uid}: ignored")
            return []
        spent = 0
        for n, pid in enumerate(sorted(pids)):
            if n >= MAX_RECORDS_PER_USER or spent >= MAX_BYTES_PER_USER:
                notes.append(f"{where}: more than {MAX_RECORDS_PER_USER} records or "
                             f"{MAX_BYTES_PER_USER} bytes; the rest not read")
                break
            name = protocol.stats_name(pid)
            try:
                got, size = _read_record(fd, name, pid, uid, now, stale_after, prune=True,
                                         precheck=False)
            except _Refused as exc:
                notes.append(f"{where}/{name}: {exc}")
                continue
            out += got
            spent += size
    finally:
        os.close(fd)
    return out


def _live_pids() -> set[int] | None:
    """The pids alive now (one listing of /proc), or None where there is no /proc."""
    try:
        return {int(n) for n in os.listdir("/proc") if n.isdigit() and n.isascii()}
    except OSError:
        return None


def _read_user_dir(base_fd: int, probe_dir: str, uid: int, now: float, stale_after: float,
                   notes: list[str], prune: bool, live: set[int] | None) -> list[ProbeSample]:
    where = os.path.join(probe_dir, str(uid))
    try:
        fd = protocol.open_dir(str(uid), dir_fd=base_fd)
    except OSError as exc:
        notes.append(f"{where}: {exc.strerror or exc}")
        return []
    out: list[ProbeSample] = []
    records = spent = 0
    try:
        owner = os.fstat(fd).st_uid
        if owner != uid:
            notes.append(f"{where}: owned by uid {owner}, not {uid}: ignored")
            return []
        with os.scandir(fd) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_ENTRIES_PER_USER:
                    notes.append(f"{where}: more than {MAX_ENTRIES_PER_USER} entries; "
                                 "the rest not looked at")
                    break
                m = _STATS_RE.fullmatch(entry.name)
                if m is None:
                    continue
                if not entry.is_file(follow_symlinks=False):
                    notes.append(f"{where}/{entry.name}: not a regular file")
                    continue
                pid = int(m.group(1))
                if live is not None and pid not in live:
                    if prune:  # a record of a process long gone: never opened
                        protocol.unlink_quietly(fd, entry.name)
                    continue
                if records >= MAX_RECORDS_PER_USER or spent >= MAX_BYTES_PER_USER:
                    notes.append(f"{where}: more than {MAX_RECORDS_PER_USER} records or "
                                 f"{MAX_BYTES_PER_USER} bytes; the rest not read")
                    break
                records += 1
                try:
                    got, size = _read_record(fd, entry.name, pid, uid, now, stale_after, prune)
                    out += got
                    spent += size
                except _Refused as exc:
                    notes.append(f"{where}/{entry.name}: {exc}")
    finally:
        os.close(fd)
    return out


class _Refused(Exception):
    pass


def _read_record(fd: int, name: str, pid: int, uid: int, now: float, stale_after: float,
                 prune: bool, precheck: bool = True) -> tuple[list[ProbeSample], int]:
    """(the record's samples, bytes read)."""
    if precheck:
        # The process first: a record of someone else's (or no) process is not worth reading.
        alive, why = _process_matches(pid, uid, None)
        if not alive:
            if prune and not why:
                protocol.unlink_quietly(fd, name)
            if why:
                raise _Refused(why)
            return [], 0
    try:
        data, st = protocol.read_regular(fd, name, protocol.MAX_RECORD_BYTES)
    except FileNotFoundError:
        return [], 0  # the probe stopped between listing and reading
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
        return [], len(data)
    limit = max(stale_after, 3 * (rec.interval_seconds or 0.0))
    if now - rec.t > limit or rec.t - now > limit:
        return [], len(data)  # not updated lately (a hung or stopped probe): no numbers
    out = []
    for s in rec.samples:
        if s.pid != pid:
            raise _Refused(f"sample for pid {s.pid} in the record of pid {pid}")
        if s.t is None:
            s.t = rec.t
        if s.create_time is None:
            s.create_time = rec.create_time
        out.append(s)
    return out, len(data)


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
