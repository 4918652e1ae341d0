"""The OOM flight recorder inside the host process (gpuwatch/probe_agent/oom.py), against a
stand-in for torch's allocator surface: one record per burst, what it keeps, its bounds, how
it is written, that it never raises into the allocator; and, in a real child process that
imports gpuwatch.probe, a record that outlives a process killed by its OOM."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import stat
import subprocess
import sys

import pytest

from gpuwatch.probe_agent import oom as oom_mod
from gpuwatch.probe_agent.oom import OomRecorder, RaiseWatch
from gpuwatch.probe_agent.oom_summary import summarize
from gpuwatch.probe_channel import oom as fmt
from gpuwatch.probe_channel import protocol
from gpuwatch.probe_channel.config import ProbeConfig
from tests.fake_torch_oom import (
    GIB,
    MIB,
    FakeTorch,
    OutOfMemoryError,
    fragmented,
    oom_site,
    segment,
)
from tests.helpers import REPO


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Watch:
    """What the raise watch would have seen (sys.monitoring is Python 3.12+)."""

    def __init__(self, raised=False, handled=False, available=True):
        self.raised, self.handled, self.available, self.opened, self.closed = (
            raised, handled, available, 0, 0)
        self.supported = available

    def open(self, reset=True):
        self.opened += 1
        return self.available

    def close(self):
        self.closed += 1


_made: list[OomRecorder] = []


@pytest.fixture(autouse=True)
def _close_recorders():
    yield
    while _made:  # each holds a sys.monitoring tool id while a burst is open
        _made.pop().close(exited=False)


def recorder(tmp_path, torch, clock=None, **cfg) -> OomRecorder:
    d = tmp_path / "own"
    d.mkdir(mode=0o700, exist_ok=True)
    published = []
    rec = OomRecorder(torch, ProbeConfig(**cfg), os.getpid(), 1_700_000_000.0,
                      open_dir=lambda: protocol.open_dir(str(d)),
                      on_record=lambda: published.append(1), clock=clock or Clock())
    rec.published = published
    rec.dir = d
    _made.append(rec)
    return rec


def records(d) -> dict[int, fmt.OomRecord]:
    out = {}
    for name in os.listdir(d):
        m = fmt.NAME_RE.fullmatch(name)
        if m:
            out[int(m.group(2))] = fmt.record_decoder.decode((d / name).read_bytes())
    return out


def fail(torch, size):
    with contextlib.suppress(OutOfMemoryError):
        torch.fail(size)


# -- one record per OOM burst ---------------------------------------------------------------

def test_calls_close_together_are_one_record_finished_when_the_burst_is_over(tmp_path):
    torch = FakeTorch(free=300 * MIB, segments=[segment(GIB, [(GIB, "active_allocated")])])
    clock = Clock()
    rec = recorder(tmp_path, torch, clock)
    rec.watch = Watch(raised=True)
    for size in (512 * MIB, 256 * MIB, 128 * MIB):  # cuDNN trying smaller workspaces
        rec.on_oom(0, size, torch.total, torch.free)
        clock.t += 0.2
    [first] = records(rec.dir).values()
    assert (first.seq, first.final, first.outcome) == (1, False, "pending")
    assert first.request_bytes == 512 * MIB and first.device_free_bytes == 300 * MIB
    assert rec.published == [1]  # the stats record is republished once, at the first call
    rec.tick(clock.t + 0.5)  # within the burst still
    assert not records(rec.dir)[1].final
    rec.tick(clock.t + 1.1)
    done = records(rec.dir)[1]
    assert done.final and done.outcome == "raised" and not done.exited
    assert done.observer_calls == 3
    assert done.requests == [512 * MIB, 256 * MIB, 128 * MIB]
    assert rec.watch.closed == 1


def test_a_later_oom_is_a_second_record_and_ends_the_first(tmp_path):
    torch = FakeTorch(free=10 * MIB)
    clock = Clock()
    rec = recorder(tmp_path, torch, clock)
    rec.watch = Watch()
    rec.on_oom(0, 64 * MIB, torch.total, torch.free)
    clock.t += 5
    rec.on_oom(0, 32 * MIB, torch.total, torch.free)
    got = records(rec.dir)
    assert sorted(got) == [1, 2]
    assert got[1].final and got[1].outcome == "recovered"  # nothing reached the program
    assert not got[2].final and got[2].request_bytes == 32 * MIB


@pytest.mark.parametrize("raised, handled, exited, available, outcome", [
    (True, False, False, True, "raised"),
    (True, True, False, True, "caught"),
    (True, True, True, True, "raised"),  # caught, re-raised, and the process died of it
    (False, False, False, True, "recovered"),
    (False, False, True, False, "unknown"),  # no sys.monitoring: the process exited
    (False, False, False, False, "unknown"),
])
def test_the_outcome_says_whether_the_program_saw_the_error(tmp_path, raised, handled,
                                                             exited, available, outcome):
    torch = FakeTorch(free=0)
    rec = recorder(tmp_path, torch)
    rec.watch = Watch(raised, handled, available)
    rec.on_oom(0, GIB, torch.total, 0)
    rec.close(exited=exited)
    done = records(rec.dir)[1]
    assert (done.outcome, done.exited, done.final) == (outcome, exited, True)


# -- what a record keeps ----------------------------------------------------------------------

def test_a_full_gpu_and_a_fragmented_one_are_told_apart(tmp_path):
    full = FakeTorch(free=20 * MIB, segments=[segment(8 * GIB, [(8 * GIB, "active_allocated")])])
    frag = FakeTorch(free=20 * MIB, segments=fragmented(4))
    for torch, cause in ((full, "full"), (frag, "fragmentation")):
        d = tmp_path / cause
        d.mkdir()
        rec = recorder(d, torch)
        rec.on_oom(0, 60 * MIB, torch.total, torch.free)
        r = records(rec.dir)[1]
        assert r.cause == cause, r
    s = r.summary  # the fragmented one: 4 segments of 2 GiB, 20 MiB holes
    assert s.segments == 4 and s.reserved_bytes == 8 * GIB
    assert s.free_blocks == 4 * 52  # every other one of 102 20 MiB blocks, and an 8 MiB tail
    assert s.largest_free_block_bytes == 20 * MIB
    assert s.free_bytes > 3 * GIB
    assert s.fragmentation_ratio == pytest.approx(s.free_bytes / s.reserved_bytes)
    assert s.largest_free_share == pytest.approx(20 * MIB / s.free_bytes)


def test_the_per_process_cap_is_a_limit_oom_with_the_figures_torch_reports(tmp_path):
    # measured on the H200: set_per_process_memory_fraction(0.02), a 10 GiB request
    torch = FakeTorch(total=150_109_880_320, free=149_555_380_224,
                      segments=[segment(20 * MIB, [(2 * MIB, "active_allocated"),
                                                   (18 * MIB, "inactive")])])
    torch.cap = 3_002_197_606
    rec = recorder(tmp_path, torch)
    rec.on_oom(0, 10_737_418_240, torch.cap, torch.free)
    r = records(rec.dir)[1]
    assert (r.request_bytes, r.device_free_bytes, r.device_total_bytes, r.allowed_bytes) == (
        10_737_418_240, 149_555_380_224, 150_109_880_320, 3_002_197_606)
    assert r.cause == "limit"
    assert r.gpu_uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert r.stats["reserved_bytes.all.current"] == 20 * MIB and r.num_ooms == 0


def test_graph_pools_are_counted_apart_and_the_largest_are_named():
    segs = [segment(GIB, [(GIB, "active_allocated")]),
            segment(512 * MIB, [(100 * MIB, "active_allocated"), (412 * MIB, "inactive")],
                    pool=(1, 3)),
            segment(2 * MIB, [(MIB, "active_allocated"), (MIB, "inactive")], kind="small"),
            segment(4 * GIB, [(4 * GIB, "active_allocated")], device=1)]
    s = summarize(segs, 0)
    pools = {p.pool: p for p in s.pools}
    assert set(pools) == {"default", "1,3"}
    assert pools["1,3"].reserved_bytes == 512 * MIB and pools["1,3"].free_bytes == 412 * MIB
    assert pools["default"].segments == 2
    assert [x.total_bytes for x in s.largest_segments] == [GIB, 512 * MIB, 2 * MIB]
    assert s.largest_segments[1].pool == "1,3" and s.largest_segments[2].type == "small"
    assert s.largest_blocks == [GIB, 100 * MIB, MIB]  # device 1's are not this device's
    assert s.largest_free_blocks == [412 * MIB, MIB]
    # without memory_stats: the snapshot's own ratio, free space in split segments only (a
    # wholly free segment can go back to the driver)
    whole = summarize([*segs, segment(GIB, [(GIB, "inactive")])], 0)
    assert whole.fragmentation_ratio == pytest.approx((412 + 1) * MIB / (2 * GIB + 514 * MIB))


def test_history_is_dumped_for_memory_viz_only_where_it_is_recorded(tmp_path):
    torch = FakeTorch(free=0, segments=[segment(GIB, [(GIB, "active_allocated")])])
    rec = recorder(tmp_path, torch)
    rec.on_oom(0, GIB, torch.total, 0)
    assert not records(rec.dir)[1].history
    torch.history = True
    rec.close(exited=False)
    rec2 = recorder(tmp_path / "h", torch) if (tmp_path / "h").mkdir() is None else None
    rec2.on_oom(0, GIB, torch.total, 0)
    r = records(rec2.dir)[1]
    assert r.history == fmt.history_name(os.getpid(), 1)
    snap = pickle.loads((rec2.dir / r.history).read_bytes())
    assert snap["segments"] and snap["device_traces"][0]  # what memory_viz reads
    assert r.history_bytes == (rec2.dir / r.history).stat().st_size


def test_a_burst_outlasts_a_slow_history_dump(tmp_path):
    """The error reaches Python only once the observer returns: a burst timed from the call's
    start would end while the history is still being written, and its outcome would be read
    before the program saw the error."""
    torch = FakeTorch(free=0, segments=[segment(GIB, [(GIB, "active_allocated")])],
                      history=True)
    clock = Clock()
    slow = torch._snapshot

    def snapshot(device=None):
        clock.t += 3.0  # a large history takes seconds to pickle
        return slow(device)

    torch.cuda.memory._snapshot = snapshot
    rec = recorder(tmp_path, torch, clock)
    rec.watch = Watch(raised=True, handled=True)
    rec.on_oom(0, GIB, torch.total, 0)
    rec.tick(clock.t + 0.5)  # the observer returned half a second ago
    first = records(rec.dir)[1]
    assert first.history and not first.final
    rec.tick(clock.t + 1.5)
    assert (records(rec.dir)[1].final, records(rec.dir)[1].outcome) == (True, "caught")


# -- bounds and writing -----------------------------------------------------------------------

def test_count_and_byte_caps_per_process(tmp_path):
    torch = FakeTorch(free=0)
    clock = Clock()
    rec = recorder(tmp_path, torch, clock, oom_max_records=2)
    for _ in range(4):
        rec.on_oom(0, GIB, torch.total, 0)
        clock.t += 10
    assert sorted(records(rec.dir)) == [1, 2] and rec.dropped == 2
    torch.history = True
    capped = recorder(tmp_path / "b", torch, clock, oom_max_bytes=1000) if (
        tmp_path / "b").mkdir() is None else None
    capped.on_oom(0, GIB, torch.total, 0)
    r = records(capped.dir)[1]
    assert not r.history and "allocation history not kept" in " ".join(r.notes)
    assert not [n for n in os.listdir(capped.dir) if n.endswith(".pickle") or n.startswith(".")]
    clock.t += 10
    capped.on_oom(0, GIB, torch.total, 0)  # the cap is spent: nothing more is written
    assert sorted(records(capped.dir)) == [1] and capped.dropped == 1


def test_records_are_owner_only_whole_and_within_the_size_cap(tmp_path):
    torch = FakeTorch(free=0, segments=fragmented(40))  # 4000 blocks
    rec = recorder(tmp_path, torch)
    rec.on_oom(0, 60 * MIB, torch.total, 0)
    rec.close(exited=False)
    names = os.listdir(rec.dir)
    assert names == [fmt.record_name(os.getpid(), 1)]  # no temporary file left
    path = rec.dir / names[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_size <= fmt.MAX_RECORD_BYTES
    r = fmt.record_decoder.decode(path.read_bytes())
    assert len(r.summary.largest_segments) == fmt.TOP and r.summary.free_blocks == 40 * 52
    assert r.capture_seconds is not None and r.capture_seconds > 0


def test_the_observer_never_raises_into_the_allocator(tmp_path, caplog):
    torch = FakeTorch(free=0)
    torch.fail_stats = torch.fail_snapshot = True
    rec = recorder(tmp_path, torch)
    rec.on_oom(0, GIB, torch.total, 0)  # nothing raised
    r = records(rec.dir)[1]
    assert any("memory_stats" in n for n in r.notes) and any("snapshot" in n for n in r.notes)
    rec.dir.chmod(0o500)  # the directory cannot be written
    try:
        if os.geteuid() != 0:
            rec.on_oom(0, 2 * GIB, torch.total, 0)
    finally:
        rec.dir.chmod(0o700)
    rec._open_dir = lambda: (_ for _ in ()).throw(OSError("gone"))
    rec.tick(rec._clock() + 60)  # finalising fails quietly too
    assert rec.errors
    rec.on_oom("not a device", None, None, None)  # garbage from a broken torch


def test_after_stop_the_attached_observer_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(oom_mod, "_attached_pid", None)
    monkeypatch.setattr(oom_mod, "_current", None)
    torch = FakeTorch(free=0)
    rec = recorder(tmp_path, torch)
    assert oom_mod.install(rec) is None and len(torch.observers) == 1
    assert oom_mod.install(rec) is None and len(torch.observers) == 1  # once per process
    fail(torch, GIB)
    assert sorted(records(rec.dir)) == [1]
    oom_mod.uninstall(rec)
    fail(torch, GIB)
    assert sorted(records(rec.dir)) == [1] and records(rec.dir)[1].final
    monkeypatch.setattr(oom_mod, "_attached_pid", None)
    old = FakeTorch()
    old._C = type("C", (), {})()
    assert "no OOM observer" in oom_mod.install(recorder(tmp_path / "o", old)
                                                if (tmp_path / "o").mkdir() is None else None)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is Python 3.12+")
def test_the_raise_watch_sees_an_oom_reach_python_and_be_caught():
    watch = RaiseWatch((OutOfMemoryError,))
    assert watch.open()
    try:
        raise OutOfMemoryError("x")
    except OutOfMemoryError:
        pass
    assert watch.raised and watch.handled
    watch.open()
    with contextlib.suppress(ValueError):
        int("x")
    assert not watch.raised
    watch.close()
    assert watch.tool is None


# -- in a real process ---------------------------------------------------------------------

CHILD = r"""
import os, sys, time
import torch
torch.cuda.init()
import gpuwatch.probe as probe
torch.cuda.alloc(64 * 1024 * 1024)
while probe.current().oom is None:  # the probe attaches its observer once CUDA is up
    time.sleep(0.01)
print(os.getpid(), flush=True)
import torch._C as C
free = 5 * 1024 * 1024
for obs in C.observers:
    obs(0, 1 << 30, 80 << 30, free)
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB.")
"""


def test_a_process_killed_by_its_oom_leaves_a_final_record(tmp_path):
    site = oom_site(tmp_path / "site")
    probe_dir = tmp_path / "probe"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]),
               GPUWATCH_PROBE_DIR=str(probe_dir), GPUWATCH_PROBE_INTERVAL_SECONDS="0.1")
    res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "OutOfMemoryError" in res.stderr, res.stderr
    pid = int(res.stdout.split()[0])
    own = probe_dir / str(os.geteuid())
    assert not (own / protocol.stats_name(pid)).exists()  # the probe's record went with it
    r = fmt.record_decoder.decode((own / fmt.record_name(pid, 1)).read_bytes())
    assert r.final and r.exited and r.request_bytes == 1 << 30
    assert r.device_free_bytes == 5 * MIB and r.cause == "full"
    # Python 3.12+ watches the error reach the program; before, it cannot tell
    assert r.outcome == ("raised" if sys.version_info >= (3, 12) else "unknown"), r
    json.loads((own / fmt.record_name(pid, 1)).read_text())
