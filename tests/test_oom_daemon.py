"""The daemon's side of the OOM flight recorder: finding and adopting the records probes leave
(gpuwatch/sources/oom_records.py), the process_oom event and what it names as having predicted
the OOM (gpuwatch/signals/process_oom.py), the metrics, and the whole trip through the real
daemon (a fake driver lists a real child process, whose real probe runs over a stand-in for
torch and dies of its OOM), its recording and the replay of it."""

from __future__ import annotations

import asyncio
import os
import pickle
import queue
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import psutil
import pytest

from gpuwatch.config import load
from gpuwatch.daemon import Daemon
from gpuwatch.events import Event
from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, OomSample, ProbeSample, ProcessSample, Tick
from gpuwatch.probe_agent.oom import OomRecorder
from gpuwatch.probe_channel import oom as fmt
from gpuwatch.probe_channel import protocol
from gpuwatch.probe_channel.config import ProbeConfig
from gpuwatch.replay import iter_events
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.process_oom import RETAIN_SECONDS, OomAnalyzer
from gpuwatch.sources import oom_records
from gpuwatch.sources.oom_records import OomReader
from gpuwatch.sources.probes import ensure_user_dir, prepare_probe_dir
from tests.fake_nvml import GIB, FakeGpu, FakeNvml, proc
from tests.fake_torch_oom import MIB, FakeTorch, fragmented, oom_site, segment
from tests.helpers import REPO

ROOT = os.geteuid() == 0
UUID = "GPU-fake-0"
ME = psutil.Process()


def gpu(*pids: int, uuid: str = UUID) -> GpuSample:
    return GpuSample(index=0, uuid=uuid, name="NVIDIA H200", memory_total_bytes=140 * GIB,
                     memory_used_bytes=100 * GIB,
                     processes=[ProcessSample(pid=p, name="python3", pod="llm-0",
                                              namespace="serving", create_time=ME.create_time()
                                              if p == os.getpid() else None) for p in pids])


def probe(pid: int, ooms: int, create_time: float | None = None) -> ProbeSample:
    return ProbeSample(pid=pid, device=0, gpu_uuid=UUID, num_ooms=ooms, reserved_bytes=GIB,
                       create_time=ME.create_time() if create_time is None else create_time)


def write_record(user_dir, torch=None, seq_calls=1, finish=True, pid=None, create_time=None,
                 seq=1, **cfg) -> OomRecorder:
    """A record written by the probe's own recorder, into `user_dir`."""
    torch = torch or FakeTorch(free=5 * MIB, segments=[segment(GIB, [(GIB, "active_allocated")])])
    rec = OomRecorder(torch, ProbeConfig(**cfg), pid or os.getpid(),
                      ME.create_time() if create_time is None else create_time,
                      open_dir=lambda: protocol.open_dir(str(user_dir)))
    rec.watch.open = lambda reset=True: False  # the outcome is not what these tests are about
    rec.records = seq - 1
    for _ in range(seq_calls):
        rec.on_oom(0, 64 * MIB, torch.total, torch.free)
    if finish:
        rec.close(exited=False)
    return rec


@pytest.fixture
def dirs(tmp_path):
    probe_dir = tmp_path / "probe"
    prepare_probe_dir(str(probe_dir))
    own = probe_dir / str(os.geteuid())
    if ROOT:
        ensure_user_dir(str(probe_dir), 0)
    else:
        own.mkdir(mode=0o700)
    return probe_dir, own, tmp_path / "snapshots"


def read(reader, dirs, gpus, probes, now=None, problems=None):
    return reader.read(time.time() if now is None else now, gpus, probes,
                       snapshot_dir=str(dirs[2]), max_total_bytes=64 << 20, problems=problems)


# -- finding and adopting ---------------------------------------------------------------

def test_a_record_is_adopted_once_and_only_looked_for_with_a_reason(dirs, monkeypatch):
    probe_dir, own, snaps = dirs
    opened = []
    real = protocol.read_regular
    monkeypatch.setattr(protocol, "read_regular",
                        lambda fd, name, cap: (opened.append(name), real(fd, name, cap))[1])
    reader = OomReader(str(probe_dir))
    assert read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 0)]) == []
    assert len(opened) == 1  # first sight: is there a record already?
    for _ in range(5):  # nothing changed: nothing opened
        assert read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 0)]) == []
    assert len(opened) == 1
    write_record(own)
    data = (own / fmt.record_name(os.getpid(), 1)).read_bytes()
    [s] = read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 1)])  # num_ooms rose
    assert (s.pid, s.seq, s.gpu_uuid, s.name, s.pod, s.namespace) == (
        os.getpid(), 1, UUID, "python3", "llm-0", "serving")
    assert (s.request_bytes, s.device_free_bytes, s.cause, s.exited) == (
        64 * MIB, 5 * MIB, "full", False)
    assert s.reserved_bytes == GIB and s.pools == {"default": GIB}
    assert os.path.dirname(s.record) == str(snaps) and s.record.endswith("-oom.json")
    assert Path(s.record).read_bytes() == data
    assert stat.S_IMODE(os.stat(s.record).st_mode) == 0o600
    assert not (own / fmt.record_name(os.getpid(), 1)).exists()  # taken out of the probe's
    opened.clear()
    assert read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 1)]) == []
    assert opened == []


def test_an_open_record_waits_for_its_probe_while_the_process_lives(dirs):
    probe_dir, own, _ = dirs
    reader = OomReader(str(probe_dir))
    rec = write_record(own, finish=False)
    now = time.time()
    assert read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 1)], now) == []
    assert read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 1)], now + 1) == []
    rec.close(exited=False)
    [s] = read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 1)], now + 2)
    assert s.outcome == "unknown" and s.observer_calls == 1
    # a probe that never finishes one: taken as it is after PENDING_WAIT_SECONDS
    write_record(own, finish=False, seq_calls=2, seq=2)
    assert read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 2)], now + 3) == []
    [late] = read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 2)],
                  now + 4 + oom_records.PENDING_WAIT_SECONDS)
    assert late.seq == 2 and late.outcome == "unknown"


def test_the_record_of_an_exited_process_is_adopted_after_it_is_gone(dirs):
    probe_dir, own, _ = dirs
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ct = psutil.Process(child.pid).create_time()
        reader = OomReader(str(probe_dir))
        assert read(reader, dirs, [gpu(child.pid)], [probe(child.pid, 0, ct)]) == []
        write_record(own, pid=child.pid, create_time=ct, finish=False)  # it died mid-burst
    finally:
        child.kill()
        child.wait()
    [s] = read(reader, dirs, [gpu()], [])
    assert (s.pid, s.exited, s.outcome, s.gpu_uuid) == (child.pid, True, "unknown", UUID)
    assert s.record
    later = time.time() + oom_records.LINGER_SECONDS + 1
    assert read(reader, dirs, [gpu()], [], later) == [] and not reader.watching


def test_history_is_adopted_beside_its_record(dirs):
    probe_dir, own, _ = dirs
    torch = FakeTorch(free=0, segments=fragmented(2), history=True)
    write_record(own, torch=torch)
    reader = OomReader(str(probe_dir))
    [s] = read(reader, dirs, [gpu(os.getpid())], [probe(os.getpid(), 1)])
    assert s.cause == "fragmentation" and s.history.endswith("-oom-history.pickle")
    assert pickle.loads(Path(s.history).read_bytes())["segments"]
    assert not list(own.iterdir())


@pytest.mark.skipif(not ROOT, reason="needs root to run a process of another uid")
def test_a_users_planted_files_are_refused_and_nothing_else_is_read(dirs, tmp_path):
    """A process of uid 4242 whose directory holds a symlink under its record's name, a FIFO,
    a record the user does not own, a record of another pid and one of an earlier process."""
    probe_dir, _own, snaps = dirs
    user = 4242
    ensure_user_dir(str(probe_dir), user)
    udir = probe_dir / str(user)
    secret = tmp_path / "secret"
    secret.write_text("root only")
    secret.chmod(0o600)
    victim = subprocess.Popen([sys.executable, "-c", "import os, time; os.setuid(4242); "
                               "print(os.getpid(), flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        pid = int(victim.stdout.readline())
        ct = psutil.Process(pid).create_time()
        os.symlink(secret, udir / fmt.record_name(pid, 1))
        os.mkfifo(udir / fmt.record_name(pid, 2))
        for seq, fields in ((3, {}), (4, {"pid": pid + 1}), (5, {"create_time": ct - 100})):
            good = fmt.OomRecord(pid=pid, seq=seq, t=ct + 1, create_time=ct, final=True,
                                 request_bytes=1, device_free_bytes=0)
            path = udir / fmt.record_name(pid, seq)
            path.write_bytes(msgspec.json.encode(msgspec.structs.replace(good, **fields)))
            if seq != 3:
                os.chown(path, user, user)  # 3: a file the user did not write
        for p in udir.iterdir():
            if not p.is_symlink():
                os.lchown(p, user if p.name != fmt.record_name(pid, 3) else 0, -1)
        reader = OomReader(str(probe_dir))
        problems: list[str] = []
        got = read(reader, dirs, [gpu(pid)], [probe(pid, 5, ct)], problems=problems)
    finally:
        victim.kill()
        victim.wait()
    assert got == [] and reader.refused == 5, problems
    assert not snaps.exists() or not list(snaps.iterdir())
    assert secret.read_text() == "root only" and len(problems) == 5


# -- the event and what predicted it ------------------------------------------------------

def oom(t: float, pid: int = 4242, **kw) -> OomSample:
    base = dict(pid=pid, t=t, seq=1, gpu_uuid=UUID, name="python3", request_bytes=64 * MIB,
                device_free_bytes=3 * MIB, device_total_bytes=140 * GIB, cause="full",
                outcome="raised", fragmentation_ratio=0.02, record="/snap/x-oom.json")
    return OomSample(**{**base, **kw})


def fire(conditions, t, signal, severity, pid=None):
    ev = Event(t=t, signal=signal, state="firing", severity=severity, gpu_uuid=UUID, pid=pid)
    return conditions.set(t, ev, (signal, UUID, pid, None))


def run(analyzer, conditions, derived, t, ooms=(), pids=(4242,)):
    tick = Tick(t=t, gpus=[gpu(*pids)], ooms=list(ooms))
    return analyzer.update(tick, derived, conditions)


def test_the_event_names_the_first_event_of_the_episode_that_predicted_it():
    a, c, d = OomAnalyzer(), Conditions(), Derived()
    [zone] = fire(c, 100.0, "memory_zone", "warning")
    run(a, c, d, 100.0)
    [warn] = fire(c, 200.0, "memory_leak", "warning", pid=4242)
    run(a, c, d, 200.0)
    [crit] = fire(c, 260.0, "memory_leak", "critical", pid=4242)  # escalated: same episode
    assert crit.ref == warn.id
    [ttoom] = fire(c, 300.0, "time_to_oom", "critical")
    run(a, c, d, 300.0)
    [ev] = run(a, c, d, 1040.0, [oom(1040.0)])
    assert ev.signal == "process_oom" and ev.state == "firing" and ev.severity == "critical"
    assert ev.ref == warn.id  # the leak began before time_to_oom; the zone predicts nothing
    assert ev.oom.predicted_by == "memory_leak" and ev.oom.lead_seconds == 840.0
    assert (ev.value, ev.threshold, ev.pid, ev.gpu_uuid) == (64 * MIB, 3 * MIB, 4242, UUID)
    assert ev.oom.record == "/snap/x-oom.json" and ev.oom.fragmentation_ratio == 0.02
    assert "Predicted 14.0 min before, by memory_leak (warning)" in ev.message
    assert ev.id and ev not in c.active.values()  # an occurrence, never resolved
    # another process on the GPU: the GPU's time_to_oom predicted it
    [other] = run(a, c, d, 1100.0, [oom(1100.0, pid=77)], pids=(4242, 77))
    assert other.ref == ttoom.id and other.oom.lead_seconds == 800.0
    assert zone.id not in (ev.ref, other.ref)


def test_only_a_zone_warned_or_nothing_did():
    a, c, d = OomAnalyzer(), Conditions(), Derived()
    [zone] = fire(c, 100.0, "memory_zone", "critical")
    run(a, c, d, 100.0)
    [ev] = run(a, c, d, 160.0, [oom(160.0)])
    assert ev.ref == zone.id and ev.oom.predicted_by == "" and ev.oom.lead_seconds is None
    assert ev.oom.warned_by == "memory_zone"
    assert "the memory zone was critical from 1.0 min before" in ev.message
    c.set(200.0, None, ("memory_zone", UUID, None, None))  # resolved
    run(a, c, d, 200.0)
    run(a, c, d, 200.0 + 121)
    [late] = run(a, c, d, 400.0, [oom(400.0, seq=2)])
    assert late.ref is None and "gpuwatch had not predicted it" in late.message


def test_an_event_after_the_oom_or_a_long_ended_episode_predicted_nothing():
    a, c, d = OomAnalyzer(), Conditions(), Derived()
    fire(c, 100.0, "memory_leak", "critical", pid=4242)
    run(a, c, d, 100.0)
    c.set(150.0, None, ("memory_leak", UUID, 4242, None))
    run(a, c, d, 150.0)
    [recent] = run(a, c, d, 200.0, [oom(200.0)])
    assert recent.oom.predicted_by == "memory_leak"  # ended 50 s before: still its forerunner
    run(a, c, d, 300.0)
    fire(c, 500.0, "time_to_oom", "warning")
    [ev] = run(a, c, d, 500.0, [oom(499.0, seq=2)])  # adopted on the tick the event fired
    assert ev.ref is None


def test_a_failure_the_program_never_saw_is_a_warning():
    a, c, d = OomAnalyzer(), Conditions(), Derived()
    [ev] = run(a, c, d, 10.0, [oom(10.0, outcome="recovered", cause="fragmentation",
                                    cached_free_bytes=3 * GIB, largest_free_block_bytes=20 * MIB)])
    assert ev.severity == "warning"
    assert "3.00 GiB free in the allocator's segments, in pieces of at most 20.0 MiB" in ev.message


def test_counters_outlive_the_process_an_hour_and_are_rendered():
    a, c, d = OomAnalyzer(), Conditions(), Derived()
    run(a, c, d, 10.0, [oom(10.0, pod="llm-0", namespace="serving")])
    run(a, c, d, 20.0, [oom(20.0, seq=2, cause="fragmentation")], pids=())
    fire(c, 25.0, "memory_leak", "critical", pid=4242)
    run(a, c, d, 25.0)
    run(a, c, d, 30.0, [oom(30.0, seq=3)], pids=())
    got = samples(Renderer().render(Snapshot(tick=Tick(t=30.0, gpus=[gpu()]), derived=d)))
    lab = {"gpu": "0", "uuid": UUID, "pid": "4242", "process": "python3",
           "namespace": "serving", "pod": "llm-0", "container": "", "slurm_job_id": ""}
    assert got[("gpuwatch_process_ooms_total", frozenset(
        {**lab, "cause": "full", "outcome": "raised"}.items()))] == 2
    assert got[("gpuwatch_process_ooms_total", frozenset(
        {**lab, "cause": "fragmentation", "outcome": "raised"}.items()))] == 1
    assert got[("gpuwatch_process_oom_lead_time_seconds", frozenset(lab.items()))] == 5.0
    assert got[("gpuwatch_gpu_ooms_total", frozenset({"gpu": "0", "uuid": UUID}.items()))] == 3
    run(a, c, d, 30.0 + RETAIN_SECONDS + 1, pids=())
    assert not d.ooms and d.gpu_ooms[UUID] == 3  # the GPU's count stays with the daemon
    quiet = samples(Renderer().render(Snapshot(tick=Tick(t=1.0, gpus=[gpu()]),
                                               derived=Derived())))
    assert quiet[("gpuwatch_gpu_ooms_total", frozenset({"gpu": "0", "uuid": UUID}.items()))] == 0


def samples(body: bytes) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


# -- the whole trip ---------------------------------------------------------------------

CHILD = r"""
import os, sys, time
import torch
torch.cuda.init()
import gpuwatch.probe as probe
held = [torch.cuda.alloc(512 * 1024 * 1024)]
while probe.current() is None or probe.current().oom is None:
    time.sleep(0.01)
print(os.getpid(), flush=True)
sys.stdin.readline()
import torch._C as C
for obs in C.observers:  # what torch does when cudaMalloc fails for good
    obs(0, 2 << 30, 140 << 30, 100 * 1024 * 1024)
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
"""

def test_the_daemon_keeps_and_explains_the_oom_of_a_process_it_dies_of(tmp_path, monkeypatch):
    site = oom_site(tmp_path / "site")
    probe_dir, snaps, rec_path = tmp_path / "probe", tmp_path / "snaps", tmp_path / "rec.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]),
               GPUWATCH_PROBE_DIR=str(probe_dir), GPUWATCH_PROBE_INTERVAL_SECONDS="0.1")
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in child.stdout], daemon=True).start()
    try:
        pid = int(lines.get(timeout=30))
        fake = FakeNvml([FakeGpu(0)])
        fake.gpus[0].processes = [proc(pid, 2 * GIB)]
        fake.install(monkeypatch)
        monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
        cfg = load(None, environ={}, overrides={
            "record": str(rec_path), "probe": {"dir": str(probe_dir)},
            "remediation": {"dry_run": True, "snapshot": {"dir": str(snaps)}}})
        daemon = Daemon(cfg)
        assert daemon._open_outputs() is None

        async def until(what, cond, seconds=20.0):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                await daemon.tick_once()
                if cond():
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"no {what}: {list(daemon.recent)}")

        async def trip():
            await until("probe sample", lambda: any(
                p.pid == pid for p in daemon.snapshot.tick.probes))
            child.stdin.write("oom\n")
            child.stdin.flush()
            await asyncio.to_thread(child.wait, 30)
            fake.gpus[0].processes = []  # it died: NVML no longer lists it
            await until("process_oom", lambda: any(
                e.signal == "process_oom" for e in daemon.recent))
        asyncio.run(trip())
        daemon._close_outputs()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert child.returncode == 1
    [ev] = [e for e in daemon.recent if getattr(e, "signal", "") == "process_oom"]
    assert (ev.pid, ev.gpu_uuid, ev.value, ev.threshold) == (pid, "GPU-fake-0", 2 << 30,
                                                           100 * MIB)
    assert ev.oom.cause == "full" and ev.oom.exited and ev.ref is None
    assert ev.oom.outcome == ("raised" if sys.version_info >= (3, 12) else "unknown")
    assert os.path.exists(ev.oom.record) and os.path.dirname(ev.oom.record) == str(snaps)
    record = fmt.record_decoder.decode(Path(ev.oom.record).read_bytes())
    assert record.summary.largest_blocks == [512 * MIB] and record.final
    got = samples(daemon.renderer.render(daemon.snapshot))
    [(labels, n)] = [(dict(k), v) for (name, k), v in got.items()
                     if name == "gpuwatch_process_ooms_total"]
    assert n == 1 and labels["pid"] == str(pid) and labels["cause"] == "full"
    # the recording holds the OOM: replay tells the same event
    replayed = [e for e in iter_events(str(rec_path), cfg, actions=False)
                if e.signal == "process_oom"]
    assert [msgspec.to_builtins(e) for e in replayed] == [msgspec.to_builtins(ev)]


# -- recordings with OOM records ------------------------------------------------------------

TRACES = REPO / "tests" / "fixtures" / "traces"


def oom_events(path: Path) -> tuple[list, list]:
    cfg = load(None, environ={})
    events = list(iter_events(str(path), cfg, actions=False))
    return [e for e in events if e.signal == "process_oom"], events


def test_the_fixture_recording_replays_to_its_ooms_and_their_forerunner():
    ooms, events = oom_events(TRACES / "sim-oom.jsonl.gz")
    frag, leak = ooms
    assert (frag.pid, frag.oom.cause, frag.oom.outcome, frag.ref) == (
        5151, "fragmentation", "caught", None)
    assert frag.slurm_job_id == "991" and frag.severity == "critical"
    first = next(e for e in events if e.signal == "memory_leak" and e.pid == 4242)
    assert (leak.pid, leak.oom.cause, leak.oom.exited, leak.ref) == (4242, "full", True, first.id)
    assert leak.oom.lead_seconds == pytest.approx(leak.t - first.t)
    assert (leak.pod, leak.namespace, leak.container) == ("llm-0", "serving", "vllm")
    again, _ = oom_events(TRACES / "sim-oom.jsonl.gz")
    assert [e.id for e in again] == [e.id for e in ooms]  # replay is deterministic


@pytest.mark.skipif(not (TRACES / "h200" / "h200-oom.jsonl.gz").exists(),
                    reason="the H200 recording of tests/gpu/test_oom_gpu.py is not committed")
def test_the_h200_recording_replays_to_its_ooms():
    ooms, events = oom_events(TRACES / "h200" / "h200-oom.jsonl.gz")
    causes = {e.oom.cause for e in ooms}
    assert {"full", "fragmentation", "limit"} <= causes
    leaked = {e.pid for e in events if e.signal == "memory_leak"}
    [died] = [e for e in ooms if e.pid in leaked]  # the process that leaked into the wall
    first = next(e for e in events if e.signal == "memory_leak" and e.pid == died.pid)
    assert died.oom.exited and died.oom.cause == "full"
    assert died.ref == first.id and died.oom.lead_seconds > 0


def test_the_report_has_an_ooms_section_with_the_verdict_and_a_plot_of_each(tmp_path):
    from gpuwatch.views.report import build

    page = build(str(TRACES / "sim-oom.jsonl.gz"), load(None, environ={}))
    section = page[page.index("<h2>OOMs (2)</h2>"):page.index("<h2>Actions")]
    assert "gpuwatch had predicted 1 of them, 54 s ahead" in section
    rows = re.findall(r'<tr class="oom" data-pid="(\d+)">(.*?)</tr>', section)
    assert [pid for pid, _ in rows] == ["5151", "4242"]
    assert "fragmentation" in rows[0][1] and "caught by the program" in rows[0][1]
    assert ">no<" in rows[0][1] and "yes: memory_leak, 54 s before" in rows[1][1]
    assert "raised, process gone" in rows[1][1] and "pid4242-oom.json" in rows[1][1]
    plots = re.findall(r'<h3 class="oom-plot" data-pid="(\d+)">.*?</figure>', section, re.S)
    assert plots == ["5151", "4242"]
    leak_plot = section[section.index('data-pid="4242">pid 4242'):]
    assert "predicted by memory_leak (54 s before)" in leak_plot and "OOM: 256 MiB" in leak_plot
    # a recording without OOMs has no such section
    quiet = build(str(TRACES / "sim-leak-flapped.jsonl.gz"), load(None, environ={}))
    assert "<h2>OOMs" not in quiet
