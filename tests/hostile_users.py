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


# A process that drops to its uid, then moves itself into the cgroup path it reads on stdin
# (empty: stays), as a user does in the cgroups systemd delegates to it.
SELF_MOVE = r"""
import os, sys, time
uid = int(sys.argv[1])
os.setgid(uid)
os.setuid(uid)
print("ready", flush=True)
target = sys.stdin.readline().strip()
if target:
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
print("moved", flush=True)
time.sleep(600)
"""


def cgroup2_root() -> str | None:
    """Where the unified (v2) hierarchy is mounted, if a test may make cgroups in it."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for _dev, where, fstype, opts, *_ in mounts:
        if fstype == "cgroup2" and "rw" in opts.split(",") and os.access(where, os.W_OK):
            return where
    return None


class Cgroups:
    """Cgroups made for one test under the v2 root, each process put back and each cgroup
    removed at the end."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.made: list[str] = []

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel.strip("/"))

    def make(self, rel: str, owner: int | None = None) -> str:
        """mkdir -p under the root; owner: delegate it (the directory and the files a
        delegated user writes), as systemd does for user@<uid>.service."""
        parts = rel.strip("/").split("/")
        for k in range(1, len(parts) + 1):
            p = os.path.join(self.root, *parts[:k])
            if not os.path.isdir(p):
                os.mkdir(p)
                self.made.append(p)
        p = self.path(rel)
        if owner is not None:
            for name in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
                os.chown(os.path.join(p, name) if name else p, owner, owner)
        return p

    def move(self, pid: int, rel: str) -> None:
        with open(os.path.join(self.make(rel), "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def close(self) -> None:
        for top in sorted(self.made, key=len, reverse=True):
            for d, _, _ in os.walk(top, topdown=False):  # users' own cgroups below too
                try:
                    with open(os.path.join(d, "cgroup.procs")) as f:
                        pids = f.read().split()
                    for pid in pids:
                        with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
                            f.write(pid)
                    os.rmdir(d)
                except OSError:
                    pass


def shared_dir() -> str:
    """A fresh directory every user may traverse (the tests' own tmp_path is root's 0700),
    for probe directories; remove it with remove_shared()."""
    d = tempfile.mkdtemp(prefix="gpuwatch-hostile-")
    os.chmod(d, 0o755)
    return d


def remove_shared(d: str) -> None:
    """Unmount what is mounted at or below d (the daemon's per-user filesystems, a test's
    small filesystem), deepest first, then remove d."""
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for p in sorted((p for p in points if p == d or p.startswith(d + "/")), reverse=True):
        subprocess.run(["umount", "-l", p], check=False, capture_output=True)
    shutil.rmtree(d, ignore_errors=True)


# A stand-in for the in-process probe, run as its uid: publishes a record with one sample
# for its pid in <probe dir>/<uid>/ (once the daemon has made that directory), and answers
# each snapshot request with a file of `size` bytes under the name the daemon expects:
# `dense` (written whole) or `sparse` (8 KiB at each end, a hole between).
SNAP_PROBE = r"""
import json, os, re, sys, time
uid, base, mode, size = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
os.setgid(uid)
os.setuid(uid)
pid, d = os.getpid(), os.path.join(base, str(uid))
req = re.compile(r"req-%d-([0-9a-f]+)\.json" % pid)
print("ready", flush=True)

def put(name, data):
    tmp = os.path.join(d, "." + name)
    with open(tmp, "w") as f:
        f.write(json.dumps(data))
    os.rename(tmp, os.path.join(d, name))

last = 0.0
while True:
    time.sleep(0.05)
    if not os.access(d, os.W_OK):  # not there yet, or still root's while the daemon makes it
        continue
    now = time.time()
    if now - last > 0.5:
        put(f"{pid}.json", {"format": "gpuwatch-probe", "version": 1, "pid": pid, "t": now,
                            "interval_seconds": 0.5, "samples": [{
                                "pid": pid, "device": 0, "t": now, "allocated_bytes": 1 << 20,
                                "reserved_bytes": 2 << 20}]})
        last = now
    for name in os.listdir(d):
        m = req.fullmatch(name)
        if m is None:
            continue
        os.unlink(os.path.join(d, name))
        snap = f"gpuwatch-probe-{pid}-{m[1]}.pickle"
        with open(os.path.join(d, snap), "wb") as f:
            if mode == "sparse":
                f.write(b"s" * 8192)
                f.seek(size - 8192)
                f.write(b"s" * 8192)
            else:
                f.write(b"d" * size)
        put(f"res-{pid}-{m[1]}.json", {"ok": True, "name": snap, "segments": 1})
"""


# A user filling what they can write of the probe filesystem: bytes until the write fails,
# then empty files until that fails; prints what it got in ("full BYTES FILES ERRNO").
FILL = r"""
import errno, os, sys, time
uid, base = int(sys.argv[1]), sys.argv[2]
os.setgid(uid)
os.setuid(uid)
d = os.path.join(base, str(uid))
print("ready", flush=True)
while not os.access(d, os.W_OK):  # the daemon makes it root's first, then the user's
    time.sleep(0.05)
written = files = 0
err = 0
try:
    with open(os.path.join(d, "junk"), "wb", buffering=0) as f:
        while True:
            written += f.write(b"\0" * 65536)
except OSError as exc:
    err = exc.errno
try:
    while True:
        open(os.path.join(d, f"j{files}"), "wb").close()
        files += 1
except OSError:
    pass
try:  # and outside its own directory, where it may not write at all
    open(os.path.join(base, "junk"), "wb").close()
    outside = "written"
except OSError as exc:
    outside = errno.errorcode.get(exc.errno, str(exc.errno))
print(f"full {written} {files} {errno.errorcode.get(err, err)} {outside}", flush=True)
time.sleep(600)
"""


def snapshot_via_webhook(d, pid: int, uuid: str, fingerprint: str, token: str) -> dict:
    """Ask the daemon for a snapshot of pid as Alertmanager would, and wait for the action's
    audit record (result ok or failed)."""
    import json
    import urllib.request

    from gpuwatch.remediation.audit import read_records
    from tests.helpers import wait_until
    from tests.test_remediation_webhook import alert, payload

    body = json.dumps(payload(alert(pid=pid, uuid=uuid, fingerprint=fingerprint))).encode()
    req = urllib.request.Request(d.url + "/alertmanager", data=body, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
    audit = d.log_path.parent / f"state-{d.port}" / "audit.jsonl"

    def done():
        return [r for r in read_records(audit) if r.get("action") == "snapshot"
                and r.get("detail", {}).get("fingerprint") == fingerprint
                and r.get("result") in ("ok", "failed")] if audit.exists() else []
    return wait_until(done, 60, what=f"the snapshot of pid {pid}")[0]
