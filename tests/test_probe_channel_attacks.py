"""A hostile GPU user against the probe channel of a root daemon, with real processes of
another uid: a fake "probe" that answers snapshot requests with paths it swaps between its
own directory and a symlink into a root-only one, and plants links under the expected name;
squatters of other users' directories; junk records by the thousand."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.remediation.hooks import HookFailed, Target
from gpuwatch.remediation.hooks import snapshot as snapshot_hook
from gpuwatch.sources import probes as probe_source
from gpuwatch.sources.probes import (
    ProbeReader,
    ensure_user_dir,
    prepare_probe_dir,
    read_probes,
)
from tests.helpers import child_env

ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not ROOT, reason="needs root to run processes of other uids")
ATTACKER, VICTIM = 4242, 4343
SECRET = b"root-only secret 7f3a"

# The attacker's "probe": publishes a record for its own pid, answers every snapshot request
# with a path under its directory `d`, which a second process keeps swapping between a real
# directory and a symlink to the root-only directory, and puts a symlink (or its own file)
# under the snapshot name the daemon expects.
ATTACK = r"""
import ctypes, json, os, re, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
base, secret_dir = sys.argv[1], sys.argv[2]
os.setgid(int(sys.argv[3]))  # started as root to reach the interpreter, then an ordinary user
os.setuid(int(sys.argv[3]))
uid, pid = os.getuid(), os.getpid()
d = os.path.join(base, str(uid))
if not os.path.isdir(d):
    os.mkdir(d, 0o700)
os.makedirs(os.path.join(d, "dreal"), exist_ok=True)
with open(os.path.join(d, "dreal", "secret.txt"), "w") as f:
    f.write("the attacker's own decoy")
os.symlink(secret_dir, os.path.join(d, "dlink"))

def put(name, data):
    tmp = os.path.join(d, "." + name)
    with open(tmp, "w") as f:
        f.write(json.dumps(data))
    os.rename(tmp, os.path.join(d, name))

def publish():
    while True:
        put(f"{pid}.json", {"format": "gpuwatch-probe", "version": 1, "pid": pid,
                            "t": time.time(), "samples": []})
        time.sleep(0.2)

def swap():
    # renameat2(RENAME_EXCHANGE): `d` is always there, half the time the real directory.
    here, there = os.path.join(d, "d").encode(), os.path.join(d, "dlink").encode()
    os.rename(os.path.join(d, "dreal"), os.path.join(d, "d"))
    n = 0
    while True:
        libc.renameat2(-100, here, -100, there, 2)
        n += 1
        if n % 2:  # linger now and then, so that some checks and uses fall apart
            time.sleep((n % 7) * 0.00005)

if os.fork() == 0:  # the swapper is a process of its own: it races at full speed
    try:
        swap()
    finally:
        os._exit(0)
threading.Thread(target=publish, daemon=True).start()
req = re.compile(r"req-(\d+)-([0-9a-f]+)\.json")
n = 0
print("ready", flush=True)
while True:
    for name in os.listdir(d):
        m = req.fullmatch(name)
        if m is None:
            continue
        rid = m.group(2)
        try:
            os.unlink(os.path.join(d, name))
        except OSError:
            continue
        n += 1
        for where in ("d", "dlink"):  # a fresh decoy in whichever is the real directory
            try:
                with open(os.path.join(d, where, "secret.txt"), "x") as f:
                    f.write("the attacker's own decoy")
            except OSError:
                pass
        snap = f"gpuwatch-probe-{pid}-{rid}.pickle"
        planted = os.path.join(d, snap)
        if n % 3 == 0:
            os.symlink(os.path.join(secret_dir, "secret.txt"), planted)
        elif n % 3 == 1:
            os.symlink(os.path.join(d, "d", "secret.txt"), planted)
        else:
            with open(planted, "w") as f:
                f.write("the attacker's own file")
        put(f"res-{pid}-{rid}.json", {"ok": True, "path": os.path.join(d, "d", "secret.txt"),
                                      "name": snap, "segments": 1})
    time.sleep(0.0005)
"""


@pytest.fixture
def top():
    # Reachable by other uids (pytest's own temporary directories are root's, 0700).
    path = Path(tempfile.mkdtemp(prefix="gpuwatch-attack-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def fingerprint(directory: Path) -> dict:
    out = {}
    for p in sorted(directory.rglob("*")):
        st = p.lstat()
        out[str(p)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink,
                       st.st_uid, st.st_mode, p.read_bytes() if p.is_file() else None)
    return out


def test_snapshot_adoption_race_touches_nothing_outside_the_probe_tree(top):
    probe_dir = top / "probe"
    prepare_probe_dir(str(probe_dir))
    ensure_user_dir(str(probe_dir), ATTACKER)
    secret = top / "secret"
    secret.mkdir(mode=0o700)
    for name in ("secret.txt", "other.key"):
        (secret / name).write_bytes(SECRET)
        (secret / name).chmod(0o600)
    snaps = top / "snaps"
    snaps.mkdir(mode=0o700)
    before = {**fingerprint(secret), "top": sorted(os.listdir(top))}
    attacker = subprocess.Popen([sys.executable, "-c", ATTACK, str(probe_dir), str(secret),
                                 str(ATTACKER)], stdout=subprocess.PIPE, text=True,
                                env=child_env(), cwd="/", start_new_session=True)
    try:
        assert attacker.stdout.readline().strip() == "ready"
        ct = psutil.Process(attacker.pid).create_time()
        target = Target(kind="process", gpu_uuid="GPU-attack", gpu_index=0, pid=attacker.pid,
                        create_time=ct, process_name="python3")
        gpu = GpuSample(index=0, uuid="GPU-attack", name="NVIDIA H200",
                        memory_total_bytes=1 << 37, memory_used_bytes=1 << 36,
                        processes=[ProcessSample(pid=attacker.pid, name="python3",
                                                 create_time=ct, used_memory_bytes=1 << 30)])
        snap = Snapshot(tick=Tick(t=1.0, gpus=[gpu]))

        async def attempts(n: int) -> dict:
            tally = {"copied": 0, "refused": 0}
            for i in range(n):
                try:
                    detail = await snapshot_hook.take(
                        snap, target, {}, directory=str(snaps), max_total_bytes=1 << 30,
                        probe_dir=str(probe_dir), has_probe=True, history=False, timeout=5,
                        t=1_700_000_000.0 + i)
                    tally["copied"] += "allocator_snapshot" in detail
                except HookFailed:
                    tally["refused"] += 1
            return tally
        tally = asyncio.run(attempts(300))
    finally:
        os.killpg(attacker.pid, signal.SIGKILL)  # the attacker and its swapper
        attacker.wait()
    print(f"300 snapshot requests against a swapping attacker: {tally}")
    assert sum(tally.values()) == 300
    # Nothing outside the attacker's own tree was moved, changed or linked.
    assert {**fingerprint(secret), "top": sorted(os.listdir(top))} == before
    copies = [p for p in snaps.iterdir() if p.name.endswith("-allocator.pickle")]
    assert len(copies) == tally["copied"]
    for p in snaps.iterdir():
        st = p.stat()
        assert SECRET not in p.read_bytes(), p
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600), p
    # What was copied is the attacker's own file, under our name and owner.
    assert all(p.read_bytes() == b"the attacker's own file" for p in copies)


def test_no_user_can_take_or_block_another_users_directory(top):
    probe_dir = top / "probe"
    prepare_probe_dir(str(probe_dir))
    st = probe_dir.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o755)
    # A squatter cannot create the victim's directory (nor any other).
    squat = subprocess.run([sys.executable, "-c", f"import os; os.setgid({ATTACKER}); "
                            f"os.setuid({ATTACKER}); os.mkdir({str(probe_dir)!r} + "
                            f"'/{VICTIM}', 0o700)"],
                           capture_output=True, text=True, env=child_env(), cwd="/")
    assert squat.returncode != 0 and "PermissionError" in squat.stderr
    # One left from the shared, sticky layout of older versions is set aside, not obeyed.
    (probe_dir / str(VICTIM)).mkdir(mode=0o700)
    os.chown(probe_dir / str(VICTIM), ATTACKER, ATTACKER)
    (probe_dir / str(ATTACKER)).symlink_to("/etc")
    ensure_user_dir(str(probe_dir), VICTIM)
    ensure_user_dir(str(probe_dir), ATTACKER)
    for uid in (VICTIM, ATTACKER):
        st = os.lstat(probe_dir / str(uid))
        assert (st.st_uid, st.st_mode & 0o777) == (uid, 0o700) and os.path.isdir(
            probe_dir / str(uid)) and not os.path.islink(probe_dir / str(uid))
    assert len([n for n in os.listdir(probe_dir) if n.startswith(".squatted-")]) == 2
    ensure_user_dir(str(probe_dir), VICTIM)  # already right: left alone
    assert len(os.listdir(probe_dir)) == 4


VICTIM_PROBE = r"""
import json, os, sys, time
os.setgid(int(sys.argv[2]))
os.setuid(int(sys.argv[2]))
d = os.path.join(sys.argv[1], str(os.getuid()))
pid = os.getpid()
with open(os.path.join(d, f"{pid}.json"), "w") as f:
    json.dump({"format": "gpuwatch-probe", "version": 1, "pid": pid, "t": time.time(),
               "samples": [{"pid": pid, "device": 0, "reserved_bytes": 4242}]}, f)
print("ready", flush=True)
time.sleep(120)
"""


def test_junk_in_one_users_directory_is_bounded_and_slows_nobody_else(top, monkeypatch):
    probe_dir = top / "probe"
    prepare_probe_dir(str(probe_dir))
    for uid in (ATTACKER, VICTIM):
        ensure_user_dir(str(probe_dir), uid)
    junk = probe_dir / str(ATTACKER)
    # 10k sparse 256 KB "records" of pids that do not run, and a live pid of someone else.
    for i in range(10_000):
        with open(junk / f"{3_000_000 + i}.json", "wb") as f:
            f.truncate(256 * 1024)
    with open(junk / "1.json", "wb") as f:
        f.truncate(256 * 1024)
    for p in junk.iterdir():
        os.chown(p, ATTACKER, ATTACKER)
    victim = subprocess.Popen([sys.executable, "-c", VICTIM_PROBE, str(probe_dir), str(VICTIM)],
                              stdout=subprocess.PIPE, text=True, env=child_env(), cwd="/")
    try:
        assert victim.stdout.readline().strip() == "ready"
        opened = []
        real = probe_source.protocol.read_regular

        def counting(fd, name, max_bytes):
            opened.append(name)
            return real(fd, name, max_bytes)
        monkeypatch.setattr(probe_source.protocol, "read_regular", counting)
        # The daemon's reader: only the records of processes on a GPU, opened by name.
        t0 = time.perf_counter()
        samples, problems = ProbeReader(str(probe_dir)).read(
            time.time(), [victim.pid], stale_after=30)
        took = time.perf_counter() - t0
        assert [(s.pid, s.reserved_bytes) for s in samples] == [(victim.pid, 4242)]
        assert opened == [f"{victim.pid}.json"] and problems == []
        print(f"daemon's read with 10k junk files: {took * 1e3:.1f} ms")
        # The listing reader (scripts): bounded, and the junk is never opened (dead pids are
        # pruned unread; pid 1 is not the attacker's).
        opened.clear()
        problems = []
        t0 = time.perf_counter()
        samples = read_probes(str(probe_dir), time.time(), problems=problems)
        took = time.perf_counter() - t0
    finally:
        victim.kill()
        victim.wait()
    print(f"listing read with 10k junk files: {took * 1e3:.0f} ms, {len(opened)} files opened")
    assert [(s.pid, s.reserved_bytes) for s in samples] == [(victim.pid, 4242)]
    assert opened == [f"{victim.pid}.json"]
    assert any("more than" in p and str(ATTACKER) in p for p in problems)
