"""Real processes of other users for tests of what a root daemon believes: each starts as root
(to reach the interpreter and this checkout), imports what it needs, then drops to its uid
for good (groups, gid, uid), so every file it makes is really that user's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import child_env

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root to run processes of other uids")
ALICE, MALLORY = 4242, 4343  # a GPU user, and another local user

# Everything the child uses is imported before the drop: the interpreter's own library may
# be out of the uid's reach.
_DROP = """
import json, os, stat, sys, time
_uid = int(sys.argv[1])
os.setgroups([])
os.setgid(_uid)
os.setuid(_uid)
args = sys.argv[2:]
"""

# A process of the user with a GPU job: publishes its own stats record, then waits until its
# stdin closes. args: probe dir, then the samples as JSON ("": none); a sample without a pid
# is its own.
_SLEEPER = _DROP + """
base = args[0]
pid = os.getpid()
samples = json.loads(args[1]) if len(args) > 1 and args[1] else []
for s in samples:
    s.setdefault("pid", pid)
d = os.path.join(base, str(_uid))
rec = {"format": "gpuwatch-probe", "version": 1, "pid": pid, "t": time.time(),
       "interval_seconds": 3600.0, "samples": samples}
try:
    tmp = os.path.join(d, f".{pid}.tmp")
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.rename(tmp, os.path.join(d, f"{pid}.json"))
except OSError:
    pass  # no directory of ours to publish in (yet)
print(pid, flush=True)
sys.stdin.read()
"""


def shared_dir() -> Path:
    """A fresh directory other uids can reach (pytest's own are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="gpuwatch-uids-"))
    path.chmod(0o755)
    return path


def run_as(uid: int, code: str, *args: str, before: str = "", timeout: float = 30) -> str:
    """Run Python code as uid (json, os, stat, sys and time imported; `args` holds the
    arguments; `before` runs as root first, for imports from this checkout); its stdout.
    Fails the test with the child's stderr when it exits non-zero."""
    r = subprocess.run([sys.executable, "-c", before + "\n" + _DROP + code, str(uid),
                        *map(str, args)],
                       capture_output=True, text=True, env=child_env(), cwd="/",
                       timeout=timeout)
    assert r.returncode == 0, f"as uid {uid}: {r.stderr}"
    return r.stdout


class Sleeper:
    """A live process of uid whose own record is in `<probe dir>/<uid>/` (where that
    directory is there to write in). samples: the record's samples (default none; one
    without a pid is the process's own)."""

    def __init__(self, uid: int, probe_dir: Path, samples: list[dict] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SLEEPER, str(uid), str(probe_dir),
             json.dumps(samples) if samples is not None else ""],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env(),
            cwd="/")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process of uid {uid} exited: {self.proc.wait()}")
        self.pid = int(line)
        self.uid = uid
        self.record = probe_dir / str(uid) / f"{self.pid}.json"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Sleepers:
    """Sleepers started for one test, all stopped at its end (the `sleepers` fixture)."""

    def __init__(self) -> None:
        self.started: list[Sleeper] = []

    def __call__(self, uid: int, probe_dir: Path, samples: list[dict] | None = None) -> Sleeper:
        s = Sleeper(uid, probe_dir, samples)
        self.started.append(s)
        return s

    def stop(self) -> None:
        for s in self.started:
            s.stop()
