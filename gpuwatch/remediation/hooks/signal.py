"""Send a signal to one process, and only to the process that was judged.

Identity is the pid together with its start time as sampled, compared exactly in clock ticks
(gpuwatch.remediation.identity). The signal goes through a pidfd: the one the remediator
opened when it first saw the process on a GPU where it holds one (a pid reused since cannot
be reached through it), else one opened *before* the identity check, so the process cannot
be swapped between check and send. Without pidfds, kill() after the check is all there is.
"""

from __future__ import annotations

import fnmatch
import os
import re
import signal as _signal
from collections.abc import Sequence

import psutil

from gpuwatch.remediation import identity
from gpuwatch.remediation.config import AllowRule
from gpuwatch.remediation.hooks import HookFailed, Refused
from gpuwatch.safetext import valid


def check_identity(pid: int, create_time: float | None,
                   proc_root: str = identity.PROC) -> psutil.Process:
    """The live process at pid, if it is the one sampled; raises Refused otherwise."""
    if pid <= 1 or pid == os.getpid():
        raise Refused(f"pid {pid} is never signalled")
    if create_time is None:
        raise Refused(f"pid {pid}: no create time was sampled, identity cannot be checked")
    try:
        same = identity.same_process(pid, create_time, proc_root)
        proc = psutil.Process(pid)
        status = proc.status()
    except psutil.NoSuchProcess:
        raise Refused(f"pid {pid} no longer exists") from None
    except psutil.AccessDenied:
        raise Refused(f"pid {pid}: access denied reading its identity") from None
    except (OSError, ValueError, IndexError) as exc:
        raise Refused(f"pid {pid}: cannot read its start time ({exc})") from None
    if same is None:
        raise Refused(f"pid {pid} no longer exists")
    if not same:
        raise Refused(f"pid {pid} no longer matches the sampled process (another start "
                      "time): pid reused")
    if status == psutil.STATUS_ZOMBIE:
        raise Refused(f"pid {pid} is a zombie")
    return proc


def allowed_by(proc: psutil.Process, rules: Sequence[AllowRule]) -> AllowRule | None:
    """The first allow-list rule that matches the process, or None."""
    try:
        with proc.oneshot():
            # Matched as the sample shows them: bytes that are not UTF-8 as \xNN.
            name = valid(proc.name())
            cmdline = valid(" ".join(proc.cmdline()))
            try:
                user = valid(proc.username())
            except KeyError:  # uid without a passwd entry
                user = str(proc.uids().real)
    except psutil.Error as exc:
        raise Refused(f"pid {proc.pid}: cannot read name/cmdline/user ({exc})") from None
    for rule in rules:
        if rule.name and not fnmatch.fnmatchcase(name, rule.name):
            continue
        if rule.cmdline and not re.search(rule.cmdline, cmdline):
            continue
        if rule.user and rule.user != user:
            continue
        return rule
    return None


def send(pid: int, create_time: float | None, signum: int,
         allow: Sequence[AllowRule], *, dry_run: bool = False,
         pidfd: int | None = None) -> dict:
    """Check identity and allow-list, then signal. pidfd: one taken when the process was
    first seen (closed here). Returns the detail for the audit log."""
    how = "pidfd held since first seen"
    if pidfd is None:
        pidfd = _pidfd_open(pid)
        how = ("start time, pidfd opened before the check" if pidfd is not None
               else "start time only (no pidfd on this system)")
    try:
        if pidfd is not None and not _alive(pidfd):
            raise Refused(f"pid {pid}: the sampled process has exited")
        proc = check_identity(pid, create_time)
        rule = allowed_by(proc, allow)
        if rule is None:
            raise Refused(f"pid {pid} ({valid(proc.name())}) matches no entry of "
                          "remediation.signal.allow")
        detail = {
            "pid": pid, "signal": _signal.Signals(signum).name, "pidfd": pidfd is not None,
            "identity": how,
            "allowed_by": {k: v for k, v in (("name", rule.name), ("cmdline", rule.cmdline),
                                             ("user", rule.user)) if v},
        }
        if dry_run:
            return detail
        try:
            if pidfd is not None:
                _signal.pidfd_send_signal(pidfd, signum)
            else:
                os.kill(pid, signum)
        except ProcessLookupError:
            raise HookFailed(f"pid {pid} exited before the signal was delivered") from None
        except PermissionError:
            raise HookFailed(f"pid {pid}: not permitted to signal it") from None
        return detail
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _alive(pidfd: int) -> bool:
    try:
        _signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pidfd_open(pid: int) -> int | None:
    if not identity.pidfd_supported():
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise Refused(f"pid {pid} no longer exists") from None
    except OSError:
        return None  # kernel without pidfd support: fall back to kill()
