"""Real processes of other uids for the local-user attack tests: a process that renames
itself through prctl(PR_SET_NAME), one that runs a binary whose file name it chose, and a
generic script runner. Each is started as root (to reach the interpreter) and drops to its
uid before it does anything else."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = os.geteuid() == 0
ATTACKER, VICTIM = 4242, 4343

# What a user can name a process: bytes that are not UTF-8, and terminal controls (ESC to
# clear the screen and set a title, CR to overwrite a line, DEL), cut by the kernel to 15.
BAD_COMM = b"\xff\xfe\x1b[2J\r\x7f\x1b]0;x\x07"
BAD_FILE = b"\xfe\xff\x1b[31m\rbin"

RENAME = r"""
import ctypes, os, sys, time
uid = int(sys.argv[1])
os.setgid(uid)
os.setuid(uid)
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(bytes.fromhex(sys.argv[2])), 0, 0, 0)
print("ready", flush=True)
time.sleep(600)
"""


def drop_to(uid: int):
    def preexec() -> None:
        os.setgid(uid)
        os.setuid(uid)
    return preexec


class Procs:
    """Processes started for one test, all killed at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.dirs: list[str] = []

    def script(self, code: str, *args: str, uid: int, ready: bool = True,
               **kw) -> subprocess.Popen:
        """python -c code args..., as root until the code drops to uid itself (argv[1])."""
        p = subprocess.Popen([sys.executable, "-c", code, str(uid), *args],
                             stdout=subprocess.PIPE, text=True, **kw)
        self.procs.append(p)
        if ready:
            line = p.stdout.readline().strip()
            assert line == "ready", f"child said {line!r}"
        return p

    def renamed(self, comm: bytes, uid: int) -> subprocess.Popen:
        return self.script(RENAME, comm.hex(), uid=uid)

    def binary_named(self, name: bytes, uid: int) -> subprocess.Popen:
        """A copy of sleep(1) under a file name of the user's choosing, run as uid."""
        d = tempfile.mkdtemp(prefix="gpuwatch-hostile-")
        self.dirs.append(d)
        os.chmod(d, 0o755)
        path = os.path.join(os.fsencode(d), name)
        shutil.copy(shutil.which("sleep"), path)
        os.chmod(path, 0o755)
        p = subprocess.Popen([path, "600"], preexec_fn=drop_to(uid))
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


def comm(pid: int) -> bytes:
    return Path(f"/proc/{pid}/comm").read_bytes().rstrip(b"\n")
