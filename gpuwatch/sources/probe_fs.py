"""Each user's probe directory a filesystem of its own, so that no user can fill another's.

A user writes into `<probe dir>/<uid>/`, and nothing in the daemon can stop a user from
writing as much as the filesystem holds into a directory they own: with one shared
filesystem, one user filling it made every other user's probe (and the daemon's requests to
it) fail with "no space left". So the limit is the kernel's, one of two ways:

- the probe directory is on a filesystem that enforces per-user quotas (tmpfs mounted with
  `usrquota` and default limits, Linux 6.6+; ext4 or XFS user quotas): every file is charged
  to its owner, the daemon's request files to root. Nothing to do here but say so;
- otherwise the daemon mounts a tmpfs of `max_bytes` and `max_files` on each `<uid>/` as it
  makes it (mode 0700, owned by uid; nosuid, nodev, noexec): a user can fill only their own.
  That needs root with CAP_SYS_ADMIN in the probes' mount namespace; where the daemon may
  not mount (the shipped systemd unit forbids it), it says so once and goes on without.

The mount is made on the new directory while it is still root's 0700, so no probe can hold
the covered directory open. It stays when the daemon stops: the records in it survive a
restart, and a directory that is already a mount point is left as it is.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os

log = logging.getLogger(__name__)

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_QUOTA_OPTIONS = ("usrquota", "uquota", "usrjquota", "quota")


def mountinfo_entry(path: str, mountinfo: str) -> tuple[str, str, set[str]] | None:
    """(mount point, filesystem type, mount and super options) of the mount holding path,
    from the text of /proc/self/mountinfo."""
    best = None
    real = os.path.realpath(path)
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if not sep or len(fields) < 6 or len(rest) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, rest[0], set(fields[5].split(",")) | set(rest[2].split(",")))
    return best


def per_user_quota(path: str) -> bool:
    """Does the filesystem holding path charge each user's files to a quota of theirs?"""
    try:
        with open("/proc/self/mountinfo") as f:
            entry = mountinfo_entry(path, f.read())
    except OSError:
        return False
    return entry is not None and any(o.split("=")[0] in _QUOTA_OPTIONS for o in entry[2])


class UserFilesystems:
    """The daemon's maker of per-user filesystems (see the module docstring)."""

    def __init__(self, probe_dir: str, max_bytes: int, max_files: int) -> None:
        self.probe_dir = probe_dir
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.mode = "off" if max_bytes <= 0 else ""  # "", quota, mount, off, or why not
        self.mounted: set[int] = set()

    def status(self) -> str:
        """One phrase for the probes source and the log: how users are kept apart."""
        if self.mode == "quota":
            return "each user's files limited by the filesystem's quota"
        if self.mode == "mount":
            return (f"each user's directory a filesystem of its own ({self.max_bytes} bytes, "
                    f"{self.max_files} files)")
        if self.mode in ("", "off"):
            return ""
        return f"users share one probe filesystem, one can fill it for all: {self.mode}"

    def make(self, path: str, uid: int) -> None:
        """Called on a new, root-owned 0700 directory: make it uid's own filesystem where the
        kernel does not keep users apart already. Never raises."""
        if self.mode == "":
            if per_user_quota(self.probe_dir):
                self.mode = "quota"
                log.info("probe directory %s: %s", self.probe_dir, self.status())
            else:
                self.mode = "mount"
        if self.mode != "mount":
            return
        opts = (f"size={self.max_bytes},nr_inodes={self.max_files},mode=0700,uid={uid},gid=0"
                ).encode()
        libc = ctypes.CDLL(None, use_errno=True)
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, opts) == 0:
            self.mounted.add(uid)
            return
        err = ctypes.get_errno()
        if err in (errno.EPERM, errno.EACCES, errno.ENOSYS, errno.ENODEV):
            self.mode = (f"cannot mount a filesystem per user here ({os.strerror(err)}); see "
                         "docs/security-local.md")
            log.warning("probe directory %s: %s", self.probe_dir, self.status())
        else:
            log.warning("probe directory %s/%d: mount failed: %s", self.probe_dir, uid,
                        os.strerror(err))
