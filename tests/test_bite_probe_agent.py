"""The probe in a user's process (probe_agent/agent.py), run as that user in a real child
process with a stand-in torch (cached memory that a flush releases): which requests it
carries out, what it says, what it sweeps, and where it agrees to publish. A request carried
out shows as an answer with `ok: true` and released bytes; one refused, as no answer or an
error. The loop's timing and the OOM observer are met in this process, with the same
stand-in, at chosen times."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import types

import pytest

from gpuwatch.probe_agent import oom as oom_recorder
from gpuwatch.probe_agent.agent import Agent
from gpuwatch.probe_channel import oom as oom_fmt
from gpuwatch.probe_channel import protocol
from gpuwatch.probe_channel.config import ProbeConfig
from gpuwatch.probe_channel.requests import send_request, wait_result
from gpuwatch.sources.probes import ensure_user_dir, prepare_probe_dir
from tests.fake_torch_oom import GIB, FakeTorch, OutOfMemoryError, segment
from tests.helpers import child_env, wait_until
from tests.other_uids import ALICE, MALLORY, needs_root

pytestmark = needs_root

# The probe as the user runs it: imports first (the interpreter's library may be out of the
# user's reach), then the drop to the uid, then the agent's own thread (answering "count"
# on stdin with what it did) or one publish. argv: uid, settings as JSON.
PROBE = r"""
import json, os, sys, types
import gpuwatch.probe_agent.agent as agent_mod
import gpuwatch.probe_agent.actions, pickle, psutil, tempfile  # noqa: F401
import gpuwatch.probe_channel.config as probe_config

settings = json.loads(sys.argv[2])
cached, history = [64 << 20], []
torch = types.ModuleType("torch")
torch.__version__ = "0.0+stand-in"
torch.version = types.SimpleNamespace(cuda="12.8")
torch.cuda = types.SimpleNamespace(
    is_initialized=lambda: True, device_count=lambda: 1,
    memory_stats=lambda i=0: {"reserved_bytes.all.current": cached[0],
                              "allocated_bytes.all.current": 0},
    memory_snapshot=lambda **kw: [], empty_cache=lambda: cached.__setitem__(0, 0),
    get_device_properties=lambda i: types.SimpleNamespace(uuid="GPU-stand-in"),
    memory=types.SimpleNamespace(
        _record_memory_history=lambda *a, **kw: history.append(kw.get("max_entries"))))
sys.modules["torch"] = torch
if settings.get("system_dir"):
    probe_config.SYSTEM_DIR = settings["system_dir"]
uid = int(sys.argv[1])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
# no OOM observer: the stand-in has no torch._C to attach it to
agent = agent_mod.Agent(probe_config.ProbeConfig(**{
    "interval_seconds": 0.1, "request_poll_seconds": 0.02, "request_max_age_seconds": 60,
    "oom_records": False, **settings["config"]}))
if settings.get("mode") == "publish":
    try:
        agent.publish()
        print("published")
    except OSError as exc:
        print(type(exc).__name__, exc)
else:
    agent.start()
    print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps({"publishes": agent.publishes, "history": history,
                          "dir": agent._dir}), flush=True)
    agent.stop()
"""


class Probe:
    def __init__(self, uid: int, *, env: dict | None = None, **settings) -> None:
        settings.setdefault("config", {})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBE, str(uid), json.dumps(settings, default=str)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=child_env(**(env or {})), cwd="/")
        self.pid = self.proc.pid

    def ready(self) -> Probe:
        line = self.proc.stdout.readline().strip()
        assert line == "ready", (line, self.stop())
        return self

    def status(self) -> dict:
        self.proc.stdin.write("count\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> str:
        """Its stderr (the warnings it logged)."""
        if self.proc.stderr.closed:  # once() took it
            return ""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        return self.proc.stderr.read()

    def once(self) -> str:
        out, _ = self.proc.communicate(timeout=60)
        return out.strip()


@pytest.fixture
def probes():
    started: list[Probe] = []

    def start(uid: int, **kw) -> Probe:
        p = Probe(uid, **kw)
        started.append(p)
        return p
    yield start
    for p in started:
        p.stop()


@pytest.fixture
def root_base(shared_tmp):
    """A root daemon's probe directory, alice's directory made."""
    base = shared_tmp / "probe"
    prepare_probe_dir(str(base))
    ensure_user_dir(str(base), ALICE)
    return base


@pytest.fixture
def alice(root_base, probes):
    """(probe dir, alice's running probe) once it has published its record."""
    probe = probes(ALICE, config={"dir": str(root_base)}).ready()
    record = root_base / str(ALICE) / protocol.stats_name(probe.pid)
    wait_until(record.exists, 30, what="alice's probe record")
    return root_base, probe


def plant(base, name: str, body: dict | str, owner: int = 0, age: float = 0.0) -> None:
    """A file in alice's directory as the daemon writes it (0644), body and owner given."""
    d = base / str(ALICE)
    tmp = d / f".plant-{protocol.new_request_id()}"
    tmp.write_text(body if isinstance(body, str) else json.dumps(body))
    tmp.chmod(0o644)
    os.chown(tmp, owner, owner)
    if age:
        os.utime(tmp, (time.time() - age, time.time() - age))
    tmp.rename(d / name)


def plant_request(base, pid: int, body: dict, owner: int = 0) -> str:
    rid = protocol.new_request_id()
    plant(base, protocol.request_name(pid, rid),
          {"id": rid, "pid": pid, "action": "flush", "t": time.time(), **body}, owner)
    return rid


def taken(base, pid: int, rid: str) -> None:
    req = base / str(ALICE) / protocol.request_name(pid, rid)
    wait_until(lambda: not req.exists(), 30, interval=0.02, what="the probe to take it")


def answer(base, pid: int, rid: str) -> dict:
    return asyncio.run(wait_result(str(base), pid, rid, timeout=30))


def no_answer_to(base, pid: int, rid: str) -> None:
    """The request was taken; a later, good request is answered, and this one never was
    (the probe answers a request in the same step that takes it)."""
    taken(base, pid, rid)
    good = send_request(str(base), pid, "flush")
    assert answer(base, pid, good)["ok"] is True
    assert not (base / str(ALICE) / protocol.result_name(pid, rid)).exists()


def test_a_fresh_request_is_carried_out(alice):
    base, probe = alice
    res = answer(base, probe.pid, send_request(str(base), probe.pid, "flush"))
    assert res["ok"] is True and res["released_bytes"] == 64 << 20


def test_a_request_the_daemon_gave_up_on_long_ago_is_dropped(alice):
    base, probe = alice
    rid = plant_request(base, probe.pid, {"t": time.time() - 3600})
    no_answer_to(base, probe.pid, rid)


def test_a_request_naming_another_pid_is_not_obeyed(alice):
    base, probe = alice
    rid = plant_request(base, probe.pid, {"pid": os.getpid()})  # under alice's pid's name
    res = answer(base, probe.pid, rid)
    assert res["ok"] is False and "another id" in res["error"]
    assert "released_bytes" not in res


def test_an_unknown_action_is_answered_as_not_done(alice):
    base, probe = alice
    res = answer(base, probe.pid, plant_request(base, probe.pid, {"action": "reboot"}))
    assert res["ok"] is False and "unknown action 'reboot'" in res["error"]


def test_requests_from_an_untrusted_uid_are_ignored_and_said_once(alice):
    base, probe = alice
    for _ in range(2):
        no_answer_to(base, probe.pid, plant_request(base, probe.pid, {}, owner=MALLORY))
    log = probe.stop()
    assert log.count(f"ignored a request from uid {MALLORY}") == 1, log


def test_a_malformed_request_name_does_not_stop_the_others(alice):
    """Names with the probe's prefix that are no request (not hex) sit on either side of a
    good request: the good one is answered, and the probe had nothing to complain about."""
    base, probe = alice
    plant(base, f"req-{probe.pid}-NOT-HEX-1.json", "{}")
    rid = protocol.new_request_id()
    plant(base, f"req-{probe.pid}-NOT-HEX-2.json", "{}")
    plant(base, protocol.request_name(probe.pid, rid),
          {"id": rid, "pid": probe.pid, "action": "flush", "t": time.time()})
    plant(base, f"req-{probe.pid}-NOT-HEX-3.json", "{}")
    assert answer(base, probe.pid, rid)["ok"] is True
    assert "gpuwatch probe:" not in probe.stop()


def test_uncollected_answers_are_swept_only_once_they_are_old(alice):
    """Every 20 publishes the probe removes its answers nobody collected, once they are
    twice request_max_age_seconds (60 s here) old; younger ones wait for the daemon."""
    base, probe = alice
    d = base / str(ALICE)
    young, old = (protocol.result_name(probe.pid, protocol.new_request_id()) for _ in "yo")
    # young: 50 s of margin for a loaded machine to reach the sweep, and still older than
    # one max age, which a sweep at the wrong horizon would take
    plant(base, young, {"ok": True}, owner=ALICE, age=70)
    plant(base, old, {"ok": True}, owner=ALICE, age=150)
    start = probe.status()["publishes"]
    wait_until(lambda: probe.status()["publishes"] >= (start // 20 + 1) * 20 + 1, 60,
               what="a sweep")
    assert (d / young).exists() and not (d / old).exists()


def test_history_is_turned_on_once_when_configured(alice, probes):
    base, _ = alice
    probe = probes(ALICE, config={"dir": str(base), "record_history_max_entries": 5000}).ready()
    wait_until(lambda: probe.status()["publishes"] >= 3, 30, what="three publishes")
    assert probe.status()["history"] == [5000]


def test_a_probe_waiting_for_the_daemon_says_so(shared_tmp, probes):
    base = shared_tmp / "probe"
    prepare_probe_dir(str(base))  # root's, and alice's directory not made yet
    out = probes(ALICE, config={"dir": str(base)}, mode="publish").once()
    assert out.startswith("WaitingForDaemon") and "the gpuwatch daemon makes it" in out, out


def test_the_probe_moves_into_the_system_directory_once_root_makes_it(shared_tmp, probes):
    """No directory configured: a user's probe starts in its private one under the temp
    directory; once a root daemon has made the shared one (and the user's directory in it),
    the probe publishes there and leaves the private one."""
    system = shared_tmp / "run" / "probe"
    tmp = shared_tmp / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    probe = probes(ALICE, system_dir=str(system), env={"TMPDIR": str(tmp)}).ready()
    private = tmp / f"gpuwatch-{ALICE}" / "probe" / str(ALICE) / protocol.stats_name(probe.pid)
    wait_until(private.exists, 30, what="the record in the private directory")
    prepare_probe_dir(str(system))
    ensure_user_dir(str(system), ALICE)
    shared = system / str(ALICE) / protocol.stats_name(probe.pid)
    wait_until(shared.exists, 30, what="the record in the system directory")
    assert not private.exists()


@pytest.mark.parametrize("uid", [0, ALICE], ids=["root process", "alice"])
def test_the_probe_publishes_into_no_directory_someone_else_owns(shared_tmp, probes, uid):
    """In a shared, sticky probe directory mallory made `<uid>` first, owner-only: a probe
    in a root process (which could write there) or in alice's refuses it, rather than put
    its records and snapshots where mallory reads them."""
    base = shared_tmp / "probe"
    base.mkdir()
    base.chmod(0o1777)
    theirs = base / str(uid)
    theirs.mkdir(mode=0o700)
    os.chown(theirs, MALLORY, MALLORY)
    out = probes(uid, config={"dir": str(base)}, mode="publish").once()
    assert out.startswith("PermissionError"), out
    assert os.listdir(theirs) == []


def test_the_probe_closes_its_own_directory_to_others(shared_tmp, probes):
    """alice's directory left open (0755) by an older version: the probe makes it 0700."""
    base = shared_tmp / "probe"
    base.mkdir(mode=0o755)
    os.chown(base, ALICE, ALICE)
    mine = base / str(ALICE)
    mine.mkdir(mode=0o755)
    os.chown(mine, ALICE, ALICE)
    assert probes(ALICE, config={"dir": str(base)}, mode="publish").once() == "published"
    assert mine.stat().st_mode & 0o777 == 0o700


# -- the loop's timing and the OOM observer, in this process ----------------------------------

def _stand_in_torch(attach=None):
    """The child's stand-in torch, here; attach: its OOM observer hook (none: an older torch)."""
    cached = [64 << 20]
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0+stand-in"
    torch.version = types.SimpleNamespace(cuda="12.8")
    torch.cuda = types.SimpleNamespace(
        is_initialized=lambda: True, device_count=lambda: 1,
        memory_stats=lambda i=0: {"reserved_bytes.all.current": cached[0],
                                  "allocated_bytes.all.current": 0},
        memory_snapshot=lambda **kw: [], empty_cache=lambda: cached.__setitem__(0, 0),
        get_device_properties=lambda i: types.SimpleNamespace(uuid="GPU-stand-in"),
        memory=types.SimpleNamespace(_snapshot=lambda: {"segments": [], "device_traces": []}))
    torch._C = types.SimpleNamespace()
    if attach is not None:
        torch._C._cuda_attach_out_of_memory_observer = attach
    return torch


def test_the_probe_publishes_once_an_interval_and_polls_requests_when_due(
        tmp_path, monkeypatch):
    """Steps at chosen times: a publish at the first, none half an interval later, the next
    exactly one interval on, or at the next step after a flush (not after a snapshot); a
    request is looked for exactly when its poll is due."""
    monkeypatch.setitem(sys.modules, "torch", _stand_in_torch())
    base = tmp_path / "probe"
    agent = Agent(ProbeConfig(dir=str(base), interval_seconds=5.0, request_poll_seconds=0.5,
                              oom_records=False))
    try:
        agent.step(1000.0)
        assert agent.publishes == 1
        send_request(str(base), os.getpid(), "flush")
        agent.step(1000.25)  # neither a publish nor a poll due
        assert (agent.publishes, agent.requests_handled) == (1, 0)
        agent.step(1000.5)  # the poll due, to the step
        assert (agent.publishes, agent.requests_handled) == (1, 1)
        agent.step(1000.75)  # the flush's effect published at once
        assert agent.publishes == 2
        rid = send_request(str(base), os.getpid(), "snapshot")
        agent.step(1001.0)
        assert asyncio.run(wait_result(str(base), os.getpid(), rid, 1.0))["ok"] is True
        for t in (1001.25, 1003.25):  # a snapshot frees nothing: no publish before it is due
            agent.step(t)
            assert agent.publishes == 2, t
        agent.step(1005.75)
        assert agent.publishes == 3
    finally:
        agent.stop()


def test_an_oom_observer_that_cannot_be_attached_is_tried_once(tmp_path, monkeypatch):
    """Attaching goes into the host's CUDA runtime: one that fails is not tried again at
    every publish."""
    calls = []

    def attach(observer):
        calls.append(observer)
        raise RuntimeError("no observer in this build")
    monkeypatch.setitem(sys.modules, "torch", _stand_in_torch(attach))
    monkeypatch.setattr(oom_recorder, "_attached_pid", None)
    agent = Agent(ProbeConfig(dir=str(tmp_path / "probe"), interval_seconds=1.0,
                              oom_records=True))
    try:
        for _ in range(3):
            agent.publish()
        assert agent.publishes == 3 and len(calls) == 1 and agent.oom is None
    finally:
        agent.stop()


def test_a_probe_stopped_while_its_process_runs_on_does_not_say_it_exited(
        tmp_path, monkeypatch):
    """stop() but for the interpreter's exit (a restart with other settings): an OOM burst
    still open is finished as one the process lived through."""
    torch = FakeTorch(free=0, segments=[segment(GIB, [(GIB, "active_allocated")])])
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(oom_recorder, "_attached_pid", None)
    monkeypatch.setattr(oom_recorder, "_current", None)
    base = tmp_path / "probe"
    agent = Agent(ProbeConfig(dir=str(base), interval_seconds=1.0, oom_records=True))
    try:
        agent.publish()  # attaches the observer
        assert agent.oom is not None
        with contextlib.suppress(OutOfMemoryError):
            torch.fail(GIB)
    finally:
        agent.stop()
    own = base / str(os.geteuid())
    [rec] = [oom_fmt.record_decoder.decode((own / n).read_bytes())
             for n in os.listdir(own) if oom_fmt.NAME_RE.fullmatch(n)]
    assert rec.final and rec.exited is False and rec.request_bytes == GIB


def test_a_request_right_after_the_host_initialised_cuda_is_carried_out(tmp_path, monkeypatch):
    """The probe published while CUDA was not initialised yet (no allocator to read); the
    host initialises it, and a flush comes before the next publish: it is carried out."""
    torch = _stand_in_torch()
    ready = [False]
    torch.cuda.is_initialized = lambda: ready[0]
    monkeypatch.setitem(sys.modules, "torch", torch)
    base = tmp_path / "probe"
    agent = Agent(ProbeConfig(dir=str(base), interval_seconds=5.0, request_poll_seconds=0.5,
                              oom_records=False))
    try:
        agent.step(1000.0)
        ready[0] = True
        rid = send_request(str(base), os.getpid(), "flush")
        agent.step(1000.5)
        result = asyncio.run(wait_result(str(base), os.getpid(), rid, 1.0))
        assert result["ok"] is True and result["released_bytes"] == 64 << 20, result
    finally:
        agent.stop()


def test_the_probes_thread_sleeps_until_its_next_turn(tmp_path, monkeypatch):
    """Between a publish and the next poll the thread waits (0.5 s here): in 0.3 s it takes
    a turn or two, not one a millisecond."""
    monkeypatch.setitem(sys.modules, "torch", _stand_in_torch())
    agent = Agent(ProbeConfig(dir=str(tmp_path / "probe"), interval_seconds=5.0,
                              request_poll_seconds=0.5, oom_records=False))
    turns = []
    step = agent.step
    monkeypatch.setattr(agent, "step", lambda now: turns.append(now) or step(now))
    agent.start()
    try:
        time.sleep(0.3)
    finally:
        agent.stop()
    assert 1 <= len(turns) <= 3, len(turns)
