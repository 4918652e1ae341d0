"""Send a signal to one process, and only to the process that was judged.

Identity is the pid together with its create time as sampled: a pid reused by a new process
has another create time and is refused. Where the platform has pidfds the signal goes
through one opened *before* the identity check, so the process cannot be swapped between
check and send.
"""

from __future__ import annotations

import fnmatch
import os
import re
import signal as _signal
from collections.abc import Sequence

import psutil

from gpuwatch.remediation.config import AllowRule
from gpuwatch.remediation.hooks import HookFailed, Refused

# psutil derives create time from boot time + start ticks: the same process reads the same
# value every time, a different one differs by far more than this.
CREATE_TIME_TOLERANCE = 0.05


def check_identity(pid: int, create_time: float | None) -> psutil.Process:
    """The live process at pid, if it is the one sampled; raises Refused otherwise."""
    if pid <= 1 or pid == os.getpid():
        raise Refused(f"pid {pid} is never signalled")
    if create_time is None:
        raise Refused(f"pid {pid}: no create time was sampled, identity cannot be checked")
    try:
        proc = psutil.Process(pid)
        live = proc.create_time()
        status = proc.status()
    except psutil.NoSuchProcess:
        raise Refused(f"pid {pid} no longer exists") from None
    except psutil.AccessDenied:
        raise Refused(f"pid {pid}: access denied reading its identity") from None
    if abs(live - create_time) > CREATE_TIME_TOLERANCE:
        raise Refused(
            f"pid {pid} no longer matches (created {live:.2f}, sampled {create_time:.2f}): "
            "pid reused"
        )
    if status == psutil.STATUS_ZOMBIE:
        raise Refused(f"pid {pid} is a zombie")
    return proc


def allowed_by(proc: psutil.Process, rules: Sequence[AllowRule]) -> AllowRule | None:
    """The first allow-list rule that matches the process, or None."""
    try:
        with proc.oneshot():
            name = proc.name()
            cmdline = " ".join(proc.cmdline())
            try:
                user = proc.username()
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
         allow: Sequence[AllowRule], *, dry_run: bool = False) -> dict:
    """Check identity and allow-list, then signal. Returns the detail for the audit log."""
    pidfd = _pidfd_open(pid)
    try:
        proc = check_identity(pid, create_time)
        rule = allowed_by(proc, allow)
        if rule is None:
            raise Refused(f"pid {pid} ({proc.name()}) matches no entry of remediation.signal.allow")
        detail = {
            "pid": pid, "signal": _signal.Signals(signum).name, "pidfd": pidfd is not None,
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


def _pidfd_open(pid: int) -> int | None:
    if not hasattr(os, "pidfd_open") or not hasattr(_signal, "pidfd_send_signal"):
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise Refused(f"pid {pid} no longer exists") from None
    except OSError:
        return None  # kernel without pidfd support: fall back to kill()
