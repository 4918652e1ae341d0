"""One user fills the probe filesystem; another user's probe, and the daemon's requests to
it, must go on working. The probe directory is a real small filesystem (a 16 MiB tmpfs the
test mounts); a real daemon as root makes each user's directory in it; real processes of
two uids write: the attacker until the kernel refuses, the victim as its probe does.

Before, the attacker's bytes and files went into the one filesystem everyone shares: the
victim's next record failed with "no space left", and so did the daemon's requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import hostile_users as hu
from tests.helpers import child_env, wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not hu.ROOT, reason="needs root to mount and to run "
                                 "processes of other uids")]

MIB = 1 << 20
TOKEN = "hostile-probe-fs-token-0123456789"


@pytest.fixture
def small_fs():
    d = hu.shared_dir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,nr_inodes=4096,mode=0755",
                        "tmpfs", d], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        hu.remove_shared(d)
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    yield d
    hu.remove_shared(d)


def test_a_user_filling_the_probe_filesystem_fills_only_their_own(daemon, procs, small_fs,
                                                                  tmp_path):
    base = f"{small_fs}/probe"
    victim = procs.script(hu.SNAP_PROBE, base, "dense", str(MIB), uid=hu.VICTIM).pid
    filler = procs.script(hu.FILL, base, uid=hu.ATTACKER)
    (tmp_path / "gpu-pids").write_text(f"{victim}\n{filler.pid}\n")
    d = daemon(module="tests.fake_nvml_daemon",
               env={"FAKE_NVML_PIDS_FILE": str(tmp_path / "gpu-pids")}, config_toml=f"""
[probe]
dir = "{base}"
user_max_bytes = {4 * MIB}
user_max_files = 64
[remediation]
cooldown_seconds = 0
[remediation.snapshot]
dir = "{tmp_path / 'snaps'}"
[webhook]
token = "{TOKEN}"
""")
    full = filler.stdout.readline().split()
    assert full[0] == "full", full
    written, files, why, outside = int(full[1]), int(full[2]), full[3], full[4]
    assert why == "ENOSPC" and written <= 4 * MIB and files <= 64, full
    assert outside == "EACCES"  # nothing but its own directory is writable to it
    # Each user's directory is a filesystem of its own, the attacker's full, the rest free.
    own = {uid: os.statvfs(f"{base}/{uid}") for uid in (hu.ATTACKER, hu.VICTIM)}
    assert os.stat(f"{base}/{hu.ATTACKER}").st_dev != os.stat(base).st_dev
    assert own[hu.ATTACKER].f_bavail == 0
    assert os.statvfs(base).f_bavail * os.statvfs(base).f_frsize > 15 * MIB

    # The victim's probe goes on publishing, and the daemon reads what it publishes now.
    def fresh():
        probes = [p for p in d.state()["sample"].get("probes", ()) if p["pid"] == victim]
        return probes and probes[0]["t"] > after
    record = Path(f"{base}/{hu.VICTIM}/{victim}.json")
    after = json.loads(wait_until(record.read_text, 20, what="the victim's record"))["t"]
    wait_until(fresh, 20, what="a record the victim published after the fill")

    # The daemon's request to the victim's probe works: a snapshot, copied out.
    uuid = d.state()["sample"]["gpus"][0]["uuid"]
    done = hu.snapshot_via_webhook(d, victim, uuid, "fs-1", TOKEN)
    assert done["result"] == "ok" and done["detail"].get("allocator_snapshot"), done
    assert "each user's directory a filesystem of its own" in json.dumps(
        d.state()["sources"]["probes"])


MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:21 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=3280636k,mode=755
31 25 0:27 / /run/gpuwatch/probe rw,nosuid,nodev shared:9 - tmpfs tmpfs rw,size=1048576k,\
nr_inodes=65536,mode=755,usrquota,usrquota_block_hardlimit=67108864
40 22 253:1 / /srv/probe rw,relatime - xfs /dev/vdb rw,attr2,inode64,usrquota
41 22 253:2 / /srv/plain rw,relatime - ext4 /dev/vdc rw
"""


@pytest.mark.parametrize("path,fstype,quota", [
    ("/run/gpuwatch/probe", "tmpfs", True), ("/run/gpuwatch/probe/4242", "tmpfs", True),
    ("/run/gpuwatch", "tmpfs", False), ("/srv/probe/x", "xfs", True),
    ("/srv/plain/probe", "ext4", False), ("/srv/plainer", "ext4", False)])
def test_the_filesystem_holding_the_probe_directory_and_its_quota(path, fstype, quota,
                                                                   monkeypatch):
    from gpuwatch.sources import probe_fs

    monkeypatch.setattr(probe_fs.os.path, "realpath", lambda p: p)
    entry = probe_fs.mountinfo_entry(path, MOUNTINFO)
    assert entry[1] == fstype
    assert any(o.split("=")[0] in probe_fs._QUOTA_OPTIONS for o in entry[2]) is quota


def test_where_the_daemon_may_not_mount_it_says_so_and_goes_on(procs):
    """As a process without the right to mount (here: an ordinary uid), the directory stays
    a plain one and the reason is given once."""
    d = hu.shared_dir()
    try:
        os.mkdir(f"{d}/{hu.ATTACKER}", 0o700)
        os.chown(f"{d}/{hu.ATTACKER}", hu.ATTACKER, -1)
        code = ("import os, sys\nfrom gpuwatch.sources.probe_fs import UserFilesystems\n"
                "os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))\n"
                "fs = UserFilesystems(sys.argv[2], 1 << 20, 64)\n"
                "fs.make(sys.argv[2] + '/' + sys.argv[1], int(sys.argv[1]))\n"
                "print(fs.status())\n")
        out = subprocess.run([sys.executable, "-c", code, str(hu.ATTACKER), d],
                             capture_output=True, text=True, env=child_env(), check=True)
        assert out.stdout.startswith("users share one probe filesystem, one can fill it for "
                                     "all: cannot mount a filesystem per user here")
        assert os.stat(f"{d}/{hu.ATTACKER}").st_dev == os.stat(d).st_dev
    finally:
        hu.remove_shared(d)
