"""The daemon's reader of probe records (sources/probes.py) and the directories root makes,
against real processes and files of other users: each guard meets what it is there to refuse.
Where a guard sits behind another layer, the test takes that layer away and says so."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from gpuwatch.sources import probes as probe_source
from gpuwatch.sources.probes import (
    ProbeReader,
    ensure_user_dir,
    prepare_probe_dir,
    read_probes,
    read_records_of,
)
from tests.other_uids import ALICE, MALLORY, needs_root, run_as

pytestmark = needs_root
OWN = [{"device": 0, "reserved_bytes": 4242}]  # a sample of the publishing process itself
# The reader's bounds as docs/probe.md states them: a record of at most 256 KiB; per user and
# read, at most 1024 records and 8 MiB (the daemon), 4096 names (the listing reader); at most
# 4096 users.
RECORD_BYTES, RECORDS, BUDGET, NAMES, USERS = 256 << 10, 1024, 8 << 20, 4096, 4096


@pytest.fixture
def base(shared_tmp):
    base = shared_tmp / "probe"
    prepare_probe_dir(str(base))
    ensure_user_dir(str(base), ALICE)
    return base


@pytest.fixture
def legacy(shared_tmp):
    """A probe directory as older versions left it: shared, sticky, world-writable."""
    base = shared_tmp / "probe"
    base.mkdir()
    base.chmod(0o1777)
    return base


def hand_directory_to(base, uid: int, owner: int) -> None:
    """Replace `<base>/<uid>` by a directory `owner` owns, holding the same files."""
    d, new = base / str(uid), base / f".new-{uid}"
    new.mkdir(mode=0o700)
    for p in d.iterdir():
        os.rename(p, new / p.name)
    d.rmdir()
    os.chown(new, owner, owner)
    os.rename(new, d)


def now() -> float:
    return time.time()


def test_the_daemon_reads_nothing_from_a_user_directory_another_uid_owns(base, sleepers):
    """ProbeReader makes each user's directory once (as root); one found later under alice's
    uid but owned by mallory is not believed, though alice's record and process are real."""
    alice = sleepers(ALICE, base, OWN)
    reader = ProbeReader(str(base))
    got, problems = reader.read(now(), [alice.pid], stale_after=30)
    assert [(s.pid, s.reserved_bytes) for s in got] == [(alice.pid, 4242)] and problems == []
    hand_directory_to(base, ALICE, MALLORY)
    got, problems = reader.read(now(), [alice.pid], stale_after=30)
    assert got == []
    assert any(f"owned by uid {MALLORY}, not {ALICE}" in p for p in problems), problems


def test_the_listing_reader_reads_nothing_from_a_directory_another_uid_owns(base, sleepers):
    alice = sleepers(ALICE, base, OWN)
    assert [s.pid for s in read_probes(str(base), now())] == [alice.pid]
    hand_directory_to(base, ALICE, MALLORY)
    problems: list[str] = []
    assert read_probes(str(base), now(), problems=problems) == []
    assert any(f"owned by uid {MALLORY}" in p for p in problems), problems
    assert alice.record.exists()  # refused, not pruned


def test_a_record_cannot_carry_numbers_for_another_users_process(base, sleepers):
    ensure_user_dir(str(base), MALLORY)
    victim = sleepers(MALLORY, base)  # mallory's process, no probe numbers of its own
    alice = sleepers(ALICE, base, [*OWN, {"pid": victim.pid, "device": 0,
                                          "reserved_bytes": 1 << 40}])
    got, problems = ProbeReader(str(base)).read(now(), [alice.pid, victim.pid],
                                                stale_after=30)
    assert [s for s in got if s.pid == victim.pid] == []
    assert any(f"sample for pid {victim.pid}" in p for p in problems), problems


@pytest.mark.parametrize("mode", [0o1777, 0o775, 0o757])
def test_root_makes_no_user_directory_in_a_probe_directory_others_may_write(shared_tmp, mode):
    """Defence in depth: the daemon's ProbeReader closes a root-owned probe directory to
    0755 (ensure_base) before it makes user directories; ensure_user_dir is met alone here,
    on a directory left writable."""
    base = shared_tmp / "probe"
    base.mkdir()
    base.chmod(mode)
    with pytest.raises(PermissionError, match="writable by others"):
        ensure_user_dir(str(base), ALICE)
    assert os.listdir(base) == []


def _probe_dir_alice_made(shared_tmp):
    """The configured probe directory, made by alice (0755, hers) in a sticky shared dir."""
    users = shared_tmp / "users"
    users.mkdir()
    users.chmod(0o1777)
    run_as(ALICE, "os.mkdir(args[0], 0o755)", users / "probe")
    return users / "probe"


def test_root_makes_no_user_directory_in_a_probe_directory_another_user_owns(
        shared_tmp, sleepers):
    """alice made the configured probe directory herself (0755, hers): a root daemon must
    not make mallory's directory in it, where alice could rename or replace it."""
    base = _probe_dir_alice_made(shared_tmp)
    mallory = sleepers(MALLORY, base)
    got, problems = ProbeReader(str(base)).read(now(), [mallory.pid], stale_after=30)
    assert got == [] and any("not making user directories" in p for p in problems), problems
    assert os.listdir(base) == []


def test_a_squatters_directory_is_set_aside_for_its_user(legacy, sleepers):
    """In the old shared layout alice took mallory's name first; the root daemon gives
    mallory a directory of her own and moves alice's out of the way."""
    run_as(ALICE, "os.mkdir(os.path.join(args[0], args[1]), 0o777)", legacy, MALLORY)
    prepare_probe_dir(str(legacy))
    mallory = sleepers(MALLORY, legacy)
    ProbeReader(str(legacy)).read(now(), [mallory.pid], stale_after=30)
    st = os.lstat(legacy / str(MALLORY))
    assert (st.st_uid, st.st_mode & 0o777) == (MALLORY, 0o700)
    assert [n for n in os.listdir(legacy) if n.startswith(f".squatted-{MALLORY}-")]


def test_a_symlinked_user_directory_is_neither_read_nor_kept(legacy, shared_tmp, sleepers):
    """alice's `<uid>` is a symlink to a directory of hers elsewhere, her live record in it."""
    elsewhere = shared_tmp / "users"
    elsewhere.mkdir()
    elsewhere.chmod(0o1777)
    run_as(ALICE, "t = os.path.join(args[1], 'mine'); os.mkdir(t, 0o700);"
                  "os.symlink(t, os.path.join(args[0], str(os.getuid())))", legacy, elsewhere)
    alice = sleepers(ALICE, legacy, OWN)
    assert (elsewhere / "mine" / alice.record.name).exists()
    # The reader on its own, before root has put its layout right: nothing through the link.
    problems: list[str] = []
    assert read_records_of(str(legacy), now(), {ALICE: [alice.pid]}, problems=problems) == []
    assert problems
    # Root's layout: the link is set aside, a real directory of alice's takes its place.
    prepare_probe_dir(str(legacy))
    ensure_user_dir(str(legacy), ALICE)
    d = legacy / str(ALICE)
    assert not d.is_symlink() and d.is_dir() and d.stat().st_uid == ALICE
    assert [n for n in os.listdir(legacy) if n.startswith(f".squatted-{ALICE}-")]


def _following_read(dir_fd: int, name: str, max_bytes: int):
    """read_regular without its O_NOFOLLOW (the layer taken away)."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        return os.read(fd, max_bytes + 1), os.fstat(fd)
    finally:
        os.close(fd)


def test_the_listing_reader_passes_no_symlinked_entry(base, shared_tmp, sleepers, monkeypatch):
    """Defence in depth: read_regular refuses to follow a symlink; here it is replaced by an
    open that follows, so that the listing's own check on each entry is met alone."""
    alice = sleepers(ALICE, base, OWN)
    run_as(ALICE, "os.rename(args[0], args[1]); os.symlink(args[1], args[0])",
           alice.record, shared_tmp / "probe" / str(ALICE) / ".kept.json")
    monkeypatch.setattr(probe_source.protocol, "read_regular", _following_read)
    problems: list[str] = []
    assert read_probes(str(base), now(), problems=problems) == []
    assert any("not a regular file" in p for p in problems), problems


# -- what it prunes, what it says, and its bounds at their edges ------------------------------

def test_the_daemon_prunes_the_record_of_a_process_that_ended(base, sleepers):
    """NVML may list a pid a little after its process ended: its record is removed."""
    alice = sleepers(ALICE, base, OWN)
    reader = ProbeReader(str(base))
    assert reader.read(now(), [alice.pid], stale_after=30)[0]
    alice.stop()
    got, problems = reader.read(now(), [alice.pid], stale_after=30)
    assert got == [] and problems == [] and not alice.record.exists()


def test_a_record_under_another_users_live_pid_is_refused_and_kept(base, sleepers):
    """Refused, not pruned: its process is not gone."""
    ensure_user_dir(str(base), MALLORY)
    victim = sleepers(MALLORY, base)
    name = base / str(ALICE) / f"{victim.pid}.json"
    run_as(ALICE, "open(args[0], 'w').write(json.dumps({'format': 'gpuwatch-probe', "
                  "'pid': int(args[1]), 't': time.time(), 'samples': []}))", name, victim.pid)
    problems: list[str] = []
    assert [s for s in read_probes(str(base), now(), problems=problems)
            if s.pid == victim.pid] == []
    assert any(f"belongs to uid {MALLORY}" in p for p in problems), problems
    assert name.exists()


def test_a_user_directory_that_is_no_directory_is_named_plainly(base):
    (base / str(MALLORY)).write_text("")
    problems: list[str] = []
    assert read_records_of(str(base), now(), {MALLORY: [1]}, problems=problems) == []
    assert problems == [f"{base}/{MALLORY}: Not a directory"]


def test_a_process_that_cannot_be_looked_at_is_not_believed(base, sleepers, monkeypatch):
    """Where /proc hides other users' processes (hidepid), psutil refuses to say whose a
    process is. Here psutil's answer for alice's real process is replaced by that refusal:
    her record is refused, with the reason."""
    alice = sleepers(ALICE, base, OWN)
    real = probe_source.psutil.Process

    class Hidden(real):
        def uids(self):
            if self.pid == alice.pid:
                raise probe_source.psutil.AccessDenied(self.pid)
            return super().uids()
    monkeypatch.setattr(probe_source.psutil, "Process", Hidden)
    problems: list[str] = []
    assert read_probes(str(base), now(), problems=problems) == []
    assert any(f"pid {alice.pid}" in p for p in problems), problems


@pytest.mark.parametrize("ahead", [-30.0, 30.0], ids=["30 s old", "30 s ahead"])
def test_a_record_exactly_at_the_staleness_limit_is_believed(base, sleepers, ahead):
    """stale_after 30 s: a record stamped 30 s before (or, a clock a little off, after) the
    reader's time is still fresh; a millisecond more and it is not."""
    alice = sleepers(ALICE, base, OWN)
    t = float(int(time.time()))
    run_as(ALICE, "r = json.load(open(args[0])); r['t'] = float(args[1]);"
                  "r['interval_seconds'] = None; open(args[0] + '.t', 'w').write(json.dumps(r));"
                  "os.rename(args[0] + '.t', args[0])", alice.record, t + ahead)
    assert [s.pid for s in read_probes(str(base), t, stale_after=30)] == [alice.pid]
    late = t - 0.001 if ahead > 0 else t + 0.001
    assert read_probes(str(base), late, stale_after=30) == []


def test_a_record_of_the_largest_size_is_read_and_one_byte_more_is_not(base, sleepers):
    alice = sleepers(ALICE, base, OWN)
    for size, believed in ((RECORD_BYTES, True), (RECORD_BYTES + 1, False)):
        run_as(ALICE, "t = open(args[0]).read().rstrip(); t += ' ' * (int(args[1]) - len(t));"
                      "open(args[0] + '.t', 'w').write(t); os.rename(args[0] + '.t', args[0])",
               alice.record, size)
        assert alice.record.stat().st_size == size
        problems: list[str] = []
        got = read_records_of(str(base), now(), {ALICE: [alice.pid]}, problems=problems)
        assert bool(got) is believed and bool(problems) is not believed, (size, problems)


def _dead_records(d, sizes: list[int]) -> list[int]:
    """Records of the given sizes, alice's, for pids that do not run (read, then pruned)."""
    pids = list(range(3_000_000, 3_000_000 + len(sizes)))
    for pid, size in zip(pids, sizes, strict=True):
        body = json.dumps({"format": "gpuwatch-probe", "pid": pid, "t": now(), "samples": []})
        path = d / f"{pid}.json"
        path.write_text(body + " " * (size - len(body)))
        os.chown(path, ALICE, ALICE)
    return pids


@pytest.mark.parametrize("short", [1, 0], ids=["a byte under the budget", "the budget"])
def test_the_daemon_reads_a_users_records_up_to_its_byte_budget(base, short):
    """8 MiB are read per user and tick: records read before the budget is spent, none
    after."""
    n = BUDGET // RECORD_BYTES
    pids = _dead_records(base / str(ALICE), [RECORD_BYTES] * (n - 1) + [RECORD_BYTES - short, 100])
    problems: list[str] = []
    read_records_of(str(base), now(), {ALICE: pids}, problems=problems)
    cut = [p for p in problems if "the rest not read" in p]
    assert bool(cut) is (short == 0), problems
    assert (base / str(ALICE) / f"{pids[-1]}.json").exists() is (short == 0)  # read: pruned


@pytest.mark.parametrize("extra", [0, 1])
def test_the_daemon_looks_up_at_most_max_records_per_user(base, extra):
    n = RECORDS + extra
    problems: list[str] = []
    read_records_of(str(base), now(), {ALICE: list(range(3_000_000, 3_000_000 + n))},
                    problems=problems)
    assert bool([p for p in problems if "the rest not read" in p]) is bool(extra), problems


def test_the_listing_reader_reads_at_most_max_records_per_user(base, sleepers, monkeypatch):
    """The cap lowered to 2 for the test (the count, not its value, is what is checked):
    three live processes of alice, two records read, and it says so."""
    monkeypatch.setattr(probe_source, "MAX_RECORDS_PER_USER", 2)
    alive = [sleepers(ALICE, base, OWN) for _ in range(3)]
    problems: list[str] = []
    got = read_probes(str(base), now(), problems=problems)
    assert len(got) == 2 and {s.pid for s in got} < {a.pid for a in alive}
    assert [p for p in problems if "more than 2 records" in p], problems


@pytest.mark.parametrize("extra", [0, 1])
def test_the_listing_reader_looks_at_most_at_max_entries_per_user(base, extra):
    d = base / str(ALICE)
    for i in range(NAMES + extra):
        (d / f"junk-{i}").touch()
    problems: list[str] = []
    read_probes(str(base), now(), problems=problems)
    assert bool([p for p in problems if "entries; the rest" in p]) is bool(extra), problems


@pytest.mark.parametrize("extra", [0, 1])
def test_the_listing_reader_looks_at_most_at_max_users(shared_tmp, extra):
    """Directories named for uids that do not own them, one note each: as many notes as
    users looked at."""
    base = shared_tmp / "probe"
    prepare_probe_dir(str(base))
    for uid in range(100_000, 100_000 + USERS + extra):
        (base / str(uid)).mkdir()
    problems: list[str] = []
    read_probes(str(base), now(), problems=problems)
    assert len([p for p in problems if "owned by uid 0" in p]) == USERS


class _SharedFilesystem:
    """What the daemon's user filesystems say where users share one (a line every read)."""

    def status(self) -> str:
        return "users share one probe filesystem, one can fill it for all: off"

    def make(self, path: str, uid: int) -> None:
        pass


@pytest.mark.parametrize("user_fs", [None, _SharedFilesystem()], ids=["plain", "status line"])
def test_an_unchanged_directory_without_records_is_not_looked_into_again(base, sleepers,
                                                                           monkeypatch, user_fs):
    """Records are renamed in: a user directory whose change time stands still holds no new
    one, and one stat of it replaces a look per pid; a record renamed in is read at once."""
    alice = sleepers(ALICE, base, OWN)
    aside = base / f"aside-{alice.pid}.json"
    os.rename(alice.record, aside)
    looks = []
    real = probe_source._read_named
    monkeypatch.setattr(probe_source, "_read_named",
                        lambda *a, **k: looks.append(a[2]) or real(*a, **k))
    # the directory changed just now: taken as settled here (the test below holds the guard)
    monkeypatch.setattr(probe_source, "RACY_NS", 0)
    reader = ProbeReader(str(base), user_fs)
    for _ in range(3):
        got, problems = reader.read(now(), [alice.pid], stale_after=30)
        assert got == [] and problems == ([user_fs.status()] if user_fs else [])
    assert looks == [ALICE]  # the first read only
    time.sleep(0.05)
    os.rename(aside, alice.record)
    got, _ = reader.read(now(), [alice.pid], stale_after=30)
    assert [s.pid for s in got] == [alice.pid] and looks == [ALICE, ALICE]
    assert [s.pid for s in reader.read(now(), [alice.pid], stale_after=30)[0]] == [alice.pid]


def test_a_directory_changed_a_moment_ago_is_looked_into_again(base, sleepers, monkeypatch):
    """The kernel stamps change times with a coarse clock: a rename in the same tick as the
    probe's temporary file leaves the change time as it was. A directory that changed within
    RACY_NS of a read is never taken for unchanged, or a record renamed in right after (a
    process's last, as it dies of its OOM) would not be read until the next change."""
    alice = sleepers(ALICE, base, OWN)
    os.rename(alice.record, base / f"aside-{alice.pid}.json")
    looks = []
    real = probe_source._read_named
    monkeypatch.setattr(probe_source, "_read_named",
                        lambda *a, **k: looks.append(a[2]) or real(*a, **k))
    monkeypatch.setattr(probe_source, "RACY_NS", 3_600 * 1_000_000_000)
    reader = ProbeReader(str(base), None)
    for _ in range(3):
        assert reader.read(now(), [alice.pid], stale_after=30)[0] == []
    assert looks == [ALICE] * 3


@pytest.mark.parametrize("mode", [0o077, 0o670, 0o604, 0o710, 0o755])
def test_any_group_or_other_bit_on_a_users_own_directory_is_closed(base, mode):
    """alice opened her directory to others (whatever she left of her own bits): the root
    daemon puts it back to 0700, still hers."""
    d = base / str(ALICE)
    d.chmod(mode)
    ensure_user_dir(str(base), ALICE)
    st = os.lstat(d)
    assert (st.st_uid, st.st_mode & 0o7777) == (ALICE, 0o700)


def test_how_users_are_kept_apart_leads_the_readers_problems(shared_tmp, sleepers):
    """The daemon reports the first three problems as the probes source's reason: the
    filesystem's phrase comes first, before the directories it could not make."""
    base = _probe_dir_alice_made(shared_tmp)
    mallory = sleepers(MALLORY, base)
    phrase = "users share one probe filesystem, one can fill it for all: test"
    user_fs = SimpleNamespace(status=lambda: phrase, make=lambda path, uid: None)
    _, problems = ProbeReader(str(base), user_fs).read(now(), [mallory.pid], stale_after=30)
    assert problems[0] == phrase
    assert any("not making user directories" in p for p in problems[1:]), problems


def test_the_daemon_makes_directories_for_at_most_max_users(shared_tmp, monkeypatch):
    """The cap lowered to 3 for the test (the count, not its value, is what is checked;
    the listing reader's test above checks 4096): four users with a process on a GPU
    (psutil's table of them stands in for real uids), three directories made."""
    monkeypatch.setattr(probe_source, "MAX_USERS", 3)
    base = shared_tmp / "probe"
    prepare_probe_dir(str(base))
    uid_of = {pid: 100_000 + pid for pid in range(1, 5)}

    class Process:
        def __init__(self, pid):
            self.pid = pid

        def uids(self):
            uid = uid_of[self.pid]
            return SimpleNamespace(real=uid, effective=uid, saved=uid)
    monkeypatch.setattr(probe_source.psutil, "Process", Process)
    ProbeReader(str(base)).read(now(), list(uid_of), stale_after=30)
    made = [n for n in os.listdir(base) if n.isdigit()]
    assert len(made) == 3
    assert all(os.stat(base / n).st_uid == int(n) for n in made)


@pytest.mark.parametrize("off, believed", [(1.0, True), (-1.0, True), (1.001, False)])
def test_a_record_within_a_second_of_the_processs_start_time_is_its_own(
        base, sleepers, off, believed):
    """psutil's create time is derived, so the record's may differ by up to a second (both
    exactly a second off, here); more, and the pid is taken for a newer process's."""
    alice = sleepers(ALICE, base, OWN)
    started = probe_source.psutil.Process(alice.pid).create_time()
    claimed = started + off
    assert (abs(started - claimed) == 1.0) is believed
    run_as(ALICE, "r = json.load(open(args[0])); r['create_time'] = float(args[1]);"
                  "open(args[0] + '.t', 'w').write(json.dumps(r));"
                  "os.rename(args[0] + '.t', args[0])", alice.record, repr(claimed))
    got = read_records_of(str(base), now(), {ALICE: [alice.pid]})
    assert bool(got) is believed
