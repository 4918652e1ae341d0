"""The daemon's side of the probe channel against files of other users: each guard of
probe_channel/requests.py and protocol.py meets the file it is there to refuse, made by a
real process of the uid it claims (or handed to that uid), in a real root probe directory.
A guard that sits behind another one is attacked with the other out of the way, and says so.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
from types import SimpleNamespace

import pytest

from gpuwatch.probe_channel import protocol
from gpuwatch.probe_channel import requests as requests_mod
from gpuwatch.probe_channel.requests import (
    ProbeUnavailableError,
    copy_out,
    send_request,
    wait_result,
)
from gpuwatch.sources.probes import ensure_user_dir, prepare_probe_dir
from tests.other_uids import ALICE, MALLORY, needs_root, run_as

pytestmark = needs_root
SECRET = b"mallory's private key 51c0"
MESSAGE_BYTES = 64 << 10  # docs/probe.md: a request or an answer is at most 64 KiB
RECORD_BYTES = 256 << 10  # and a record at most 256 KiB


@pytest.fixture
def probe(shared_tmp, sleepers):
    """(probe dir, alice's live process publishing its record there)."""
    base = shared_tmp / "probe"
    prepare_probe_dir(str(base))
    ensure_user_dir(str(base), ALICE)
    return base, sleepers(ALICE, base)


def names(d) -> list[str]:
    return sorted(os.listdir(d))


def answer_as(uid: int, d, name: str, doc: dict) -> None:
    """The probe's answer, written by a process of uid (atomically, as the probe does)."""
    run_as(uid, "tmp = os.path.join(args[0], '.a'); open(tmp, 'w').write(args[2]);"
                "os.rename(tmp, os.path.join(args[0], args[1]))", d, name, json.dumps(doc))


def test_a_request_goes_only_into_a_directory_of_the_processs_user(probe):
    base, alice = probe
    d = base / str(ALICE)
    assert send_request(str(base), alice.pid, "flush")  # the right directory: taken
    for n in names(d):
        if n.startswith("req-"):
            os.unlink(d / n)
    # The same directory, handed to another user: alice's record is still in it, but a root
    # daemon must not write there (mallory could read, swap or answer what it writes).
    os.chown(d, MALLORY, MALLORY)
    with pytest.raises(ProbeUnavailableError):
        send_request(str(base), alice.pid, "flush")
    assert [n for n in names(d) if n.startswith("req-")] == []


def test_the_probe_is_found_only_by_a_record_its_user_owns(probe):
    base, alice = probe
    d = base / str(ALICE)
    # alice's directory, but a stats record of another user's under her pid's name: no probe
    # of alice's publishes there, so nothing is asked.
    os.chown(alice.record, MALLORY, MALLORY)
    with pytest.raises(ProbeUnavailableError):
        send_request(str(base), alice.pid, "snapshot")
    assert [n for n in names(d) if n.startswith("req-")] == []


def test_an_answer_another_uid_owns_is_not_believed(probe):
    base, alice = probe
    d = base / str(ALICE)
    rid = send_request(str(base), alice.pid, "flush")
    forged = d / protocol.result_name(alice.pid, rid)
    forged.write_text(json.dumps({"ok": True, "released_bytes": 1 << 40}))
    os.chown(forged, MALLORY, MALLORY)
    with pytest.raises(ValueError, match=f"owned by uid {MALLORY}"):
        asyncio.run(wait_result(str(base), alice.pid, rid, timeout=5))
    assert not forged.exists()  # taken off, not left to be read again


def test_an_answer_naming_another_snapshot_file_is_refused(probe):
    """Defence in depth: copy_out() opens only the name it expects, whatever an answer says.
    Here the answer's check is met alone, through wait_result()."""
    base, alice = probe
    d = base / str(ALICE)
    rid = send_request(str(base), alice.pid, "snapshot")
    other = protocol.snapshot_name(alice.pid, "0123456789abcdef")
    answer_as(ALICE, d, protocol.result_name(alice.pid, rid),
              {"ok": True, "name": other, "path": str(d / other), "segments": 3})
    result = asyncio.run(wait_result(str(base), alice.pid, rid, timeout=5))
    assert result["ok"] is False and result["name"] is None
    assert "another name" in result["error"]


def test_copy_out_refuses_a_hard_link_even_to_the_users_own_file(probe, shared_tmp):
    """The owner check passes here (alice links a file of her own): only the link count
    stops root from copying whatever the name was linked to."""
    base, alice = probe
    d = base / str(ALICE)
    rid = protocol.new_request_id()
    name = protocol.snapshot_name(alice.pid, rid)
    home = shared_tmp / "alice-home"
    home.mkdir(mode=0o700)
    os.chown(home, ALICE, ALICE)
    run_as(ALICE, "p = os.path.join(args[0], 'kept.bin'); open(p, 'wb').write(b'k' * 64);"
                  "os.link(p, os.path.join(args[1], args[2]))", home, d, name)
    assert os.stat(d / name).st_nlink == 2
    dest = shared_tmp / "snaps" / "out.pickle"
    dest.parent.mkdir(mode=0o700)
    with pytest.raises(ValueError, match="2 links"):
        copy_out(str(base), alice.pid, rid, str(dest), 1 << 20)
    assert not dest.exists() and not (d / name).exists()
    assert (home / "kept.bin").read_bytes() == b"k" * 64  # the linked file is left alone


def test_copy_out_refuses_a_file_another_user_owns(probe, shared_tmp):
    """mallory's secret, in a shared directory anyone may rename in, is moved by alice under
    the snapshot name: one link, but mallory's. Root must not copy it out for alice."""
    base, alice = probe
    d = base / str(ALICE)
    shared = shared_tmp / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    run_as(MALLORY, "fd = os.open(os.path.join(args[0], 'id_ed25519'), "
                    "os.O_WRONLY | os.O_CREAT, 0o600); os.write(fd, args[1].encode())",
           shared, SECRET.decode())
    rid = protocol.new_request_id()
    name = protocol.snapshot_name(alice.pid, rid)
    run_as(ALICE, "os.rename(os.path.join(args[0], 'id_ed25519'), "
                  "os.path.join(args[1], args[2]))", shared, d, name)
    st = os.stat(d / name)
    assert (st.st_uid, st.st_nlink) == (MALLORY, 1)
    dest = shared_tmp / "snaps" / "out.pickle"
    dest.parent.mkdir(mode=0o700)
    with pytest.raises(ValueError, match=f"owned by uid {MALLORY}"):
        copy_out(str(base), alice.pid, rid, str(dest), 1 << 20)
    assert not dest.exists()


def test_copy_out_refuses_a_fifo_under_the_snapshot_name(probe, shared_tmp):
    base, alice = probe
    d = base / str(ALICE)
    rid = protocol.new_request_id()
    name = protocol.snapshot_name(alice.pid, rid)
    run_as(ALICE, "os.mkfifo(os.path.join(args[0], args[1]), 0o600)", d, name)
    dest = shared_tmp / "out.pickle"
    with pytest.raises(ValueError, match="not a regular file"):
        copy_out(str(base), alice.pid, rid, str(dest), 1 << 20)
    assert not dest.exists()  # no empty "snapshot" reported as taken


def test_a_symlinked_user_directory_is_not_followed(probe, shared_tmp):
    """`<probe dir>/<uid>` replaced by a symlink to a directory alice owns elsewhere, with her
    record in it: the daemon writes and reads nothing through the link."""
    base, alice = probe
    d = base / str(ALICE)
    elsewhere = shared_tmp / "alice-elsewhere"
    os.rename(d, elsewhere)
    os.symlink(elsewhere, d)
    assert (elsewhere / alice.record.name).exists()
    with pytest.raises(ProbeUnavailableError):
        send_request(str(base), alice.pid, "flush")
    assert [n for n in names(elsewhere) if n.startswith("req-")] == []


def test_a_symlinked_stats_record_locates_no_probe(probe, shared_tmp):
    """alice's record moved elsewhere and linked back under her pid's name: no probe of
    hers publishes in the directory itself, so nothing is asked there."""
    base, alice = probe
    elsewhere = shared_tmp / "alice-records"
    elsewhere.mkdir(mode=0o700)
    os.chown(elsewhere, ALICE, ALICE)
    run_as(ALICE, "os.rename(args[0], args[1]); os.symlink(args[1], args[0])",
           alice.record, elsewhere / alice.record.name)
    with pytest.raises(ProbeUnavailableError):
        send_request(str(base), alice.pid, "flush")
    assert [n for n in names(base / str(ALICE)) if n.startswith("req-")] == []


# -- the probe directory itself, and the largest request ---------------------------------------

def test_root_makes_the_probe_directory_and_its_parents_reachable_by_users(shared_tmp):
    base = shared_tmp / "run" / "gpuwatch" / "probe"
    protocol.ensure_base(str(base))
    for d in (base.parent.parent, base.parent, base):
        assert (d.stat().st_uid, d.stat().st_mode & 0o7777) == (0, 0o755), d
    assert run_as(ALICE, "print(os.listdir(args[0]))", base).strip() == "[]"


def test_a_users_own_probe_directory_and_its_parents_are_private(shared_tmp):
    users = shared_tmp / "users"
    users.mkdir()
    users.chmod(0o1777)
    base = users / f"gpuwatch-{ALICE}" / "probe"  # the layout of a user's default
    run_as(ALICE, "protocol.ensure_base(args[0])", base,
           before="import gpuwatch.probe_channel.protocol as protocol")
    for d in (base.parent, base):
        assert (d.stat().st_uid, d.stat().st_mode & 0o777) == (ALICE, 0o700), d


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775, 0o756, 0o750, 0o700])
def test_a_root_probe_directory_of_any_other_mode_is_put_back_to_0755(shared_tmp, mode):
    base = shared_tmp / "probe"
    base.mkdir()
    base.chmod(mode)
    protocol.ensure_base(str(base))
    assert base.stat().st_mode & 0o7777 == 0o755


def test_a_request_of_the_largest_size_is_sent_and_one_byte_more_is_not(probe, monkeypatch):
    base, alice = probe
    d = base / str(ALICE)
    monkeypatch.setattr(requests_mod, "time", SimpleNamespace(time=lambda: 1_796_166_400.25))
    # the JSON of a request with an empty pad, then the pad that brings it to the cap
    small = send_request(str(base), alice.pid, "snapshot", {"pad": ""})
    size = (d / protocol.request_name(alice.pid, small)).stat().st_size
    pad = "x" * (MESSAGE_BYTES - size)
    rid = send_request(str(base), alice.pid, "snapshot", {"pad": pad})
    assert (d / protocol.request_name(alice.pid, rid)).stat().st_size == MESSAGE_BYTES
    with pytest.raises(ValueError, match="too large"):
        send_request(str(base), alice.pid, "snapshot", {"pad": pad + "x"})


def test_a_request_is_roots_0644_and_readable_by_the_probes_user_only(probe):
    """docs/probe.md: 0644 in the user's 0700 directory. The probe's user reads it, nobody
    but root may change it, and no execute bit is set on what a user's process opens."""
    base, alice = probe
    rid = send_request(str(base), alice.pid, "flush")
    path = base / str(ALICE) / protocol.request_name(alice.pid, rid)
    st = os.stat(path)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644)
    assert json.loads(run_as(ALICE, "print(open(args[0]).read())", path))["id"] == rid
    assert "denied" in run_as(MALLORY, "try:\n    open(args[0])\nexcept PermissionError:\n"
                                       "    print('denied')", path)


def _alices_snapshot(base, alice, shared_tmp, data: bytes):
    """(request id, where copy_out is to write): a snapshot of alice's, written by her."""
    rid = protocol.new_request_id()
    run_as(ALICE, "open(os.path.join(args[0], args[1]), 'wb').write(bytes.fromhex(args[2]))",
           base / str(ALICE), protocol.snapshot_name(alice.pid, rid), data.hex())
    dest = shared_tmp / "snaps" / "out.pickle"
    dest.parent.mkdir(mode=0o700)
    return rid, dest


def _lseek_failing(monkeypatch, err: int) -> None:
    """Where SEEK_DATA / SEEK_HOLE fail with err (no filesystem of the test host does)."""
    real = os.lseek

    def lseek(fd, pos, how):
        if how in (os.SEEK_DATA, os.SEEK_HOLE):
            raise OSError(err, os.strerror(err))
        return real(fd, pos, how)
    monkeypatch.setattr(os, "lseek", lseek)


def test_a_snapshot_on_a_filesystem_without_seek_data_is_copied_whole(
        probe, shared_tmp, monkeypatch):
    """A filesystem that cannot tell holes (EINVAL to SEEK_DATA) gets the file copied as one
    run of data, not refused."""
    base, alice = probe
    data = bytes(range(256)) * 40
    rid, dest = _alices_snapshot(base, alice, shared_tmp, data)
    _lseek_failing(monkeypatch, errno.EINVAL)
    assert copy_out(str(base), alice.pid, rid, str(dest), 1 << 20) == len(data)
    assert dest.read_bytes() == data


def test_an_error_while_mapping_a_snapshot_fails_the_copy(probe, shared_tmp, monkeypatch):
    """An I/O error to SEEK_DATA is not taken for a filesystem without it: the copy fails and
    leaves no file."""
    base, alice = probe
    rid, dest = _alices_snapshot(base, alice, shared_tmp, b"s" * 4096)
    _lseek_failing(monkeypatch, errno.EIO)
    with pytest.raises(OSError) as exc:
        copy_out(str(base), alice.pid, rid, str(dest), 1 << 20)
    assert exc.value.errno == errno.EIO
    assert not dest.exists()


def test_a_record_that_grows_past_the_cap_while_read_is_refused(probe, monkeypatch):
    """The size is checked on the descriptor, then the file read. alice appends a byte to a
    record of exactly 256 KiB right after the check (the race, made to happen): the read is
    refused, not cut at the cap and believed."""
    base, _alice = probe
    d = base / str(ALICE)
    run_as(ALICE, "open(args[0], 'wb').write(b' ' * int(args[1]))", d / "grows.json",
           RECORD_BYTES)
    ino = os.stat(d / "grows.json").st_ino
    real, grown = os.fstat, []

    def fstat(fd):
        st = real(fd)
        if st.st_ino == ino and not grown:
            grown.append(True)
            run_as(ALICE, "open(args[0], 'ab').write(b'x')", d / "grows.json")
        return st
    monkeypatch.setattr(os, "fstat", fstat)
    fd = protocol.open_dir(str(d))
    try:
        with pytest.raises(ValueError, match="more than"):
            protocol.read_regular(fd, "grows.json", RECORD_BYTES)
    finally:
        os.close(fd)
    assert grown
