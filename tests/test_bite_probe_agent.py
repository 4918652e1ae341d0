"""The probe in a user's process (probe_agent/agent.py), run as that user in a real child
process with a stand-in torch (cached memory that a flush releases): which requests it
carries out, and where it agrees to publish. A request carried out shows as an answer with
`ok: true` and released bytes; one refused, as no answer or an error."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from gpuwatch.probe_channel import protocol
from gpuwatch.probe_channel.requests import send_request, wait_result
from gpuwatch.sources.probes import ensure_user_dir, prepare_probe_dir
from tests.helpers import child_env, wait_until
from tests.other_uids import ALICE, MALLORY, needs_root

pytestmark = needs_root

# The probe as the user runs it: imports first (the interpreter's library may be out of the
# user's reach), then the drop to the uid, then the agent's own thread or one publish.
PROBE = r"""
import os, sys, types
import gpuwatch.probe_agent.agent as agent_mod
import gpuwatch.probe_agent.actions, pickle, psutil  # noqa: F401
from gpuwatch.probe_channel.config import ProbeConfig

cached = [64 << 20]
torch = types.ModuleType("torch")
torch.__version__ = "0.0+stand-in"
torch.version = types.SimpleNamespace(cuda="12.8")
torch.cuda = types.SimpleNamespace(
    is_initialized=lambda: True, device_count=lambda: 1,
    memory_stats=lambda i=0: {"reserved_bytes.all.current": cached[0],
                              "allocated_bytes.all.current": 0},
    memory_snapshot=lambda **kw: [], empty_cache=lambda: cached.__setitem__(0, 0),
    get_device_properties=lambda i: types.SimpleNamespace(uuid="GPU-stand-in"))
sys.modules["torch"] = torch
uid = int(sys.argv[1])
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
agent = agent_mod.Agent(ProbeConfig(dir=sys.argv[2], interval_seconds=0.1,
                                    request_poll_seconds=0.02, request_max_age_seconds=60))
if sys.argv[3] == "publish":
    try:
        agent.publish()
        print("published")
    except OSError as exc:
        print(type(exc).__name__, exc)
else:
    agent.start()
    print("ready", flush=True)
    sys.stdin.read()
    agent.stop()
"""


def probe_process(uid: int, base, how: str = "run") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PROBE, str(uid), str(base), how],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(), cwd="/")


@pytest.fixture
def alice(shared_tmp):
    """(probe dir, alice's running probe) once it has published its record."""
    base = shared_tmp / "probe"
    prepare_probe_dir(str(base))
    ensure_user_dir(str(base), ALICE)
    proc = probe_process(ALICE, base)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        record = base / str(ALICE) / protocol.stats_name(proc.pid)
        wait_until(record.exists, 30, what="alice's probe record")
        yield base, proc
    finally:
        proc.kill()
        proc.wait()


def plant_request(base, pid: int, body: dict, owner: int = 0) -> str:
    """A request file as the daemon writes it (0644), body and owner as given."""
    d = base / str(ALICE)
    rid = protocol.new_request_id()
    tmp = d / f".plant-{rid}"
    tmp.write_text(json.dumps({"id": rid, "pid": pid, "action": "flush", "t": time.time(),
                               **body}))
    tmp.chmod(0o644)
    os.chown(tmp, owner, owner)
    tmp.rename(d / protocol.request_name(pid, rid))
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
    base, proc = alice
    res = answer(base, proc.pid, send_request(str(base), proc.pid, "flush"))
    assert res["ok"] is True and res["released_bytes"] == 64 << 20


def test_a_request_the_daemon_gave_up_on_long_ago_is_dropped(alice):
    base, proc = alice
    rid = plant_request(base, proc.pid, {"t": time.time() - 3600})
    no_answer_to(base, proc.pid, rid)


def test_a_request_naming_another_pid_is_not_obeyed(alice):
    base, proc = alice
    rid = plant_request(base, proc.pid, {"pid": os.getpid()})  # under alice's pid's name
    res = answer(base, proc.pid, rid)
    assert res["ok"] is False and "another id" in res["error"]
    assert "released_bytes" not in res


def test_a_request_from_an_untrusted_uid_is_ignored(alice):
    base, proc = alice
    rid = plant_request(base, proc.pid, {}, owner=MALLORY)
    no_answer_to(base, proc.pid, rid)


@pytest.mark.parametrize("uid", [0, ALICE], ids=["root process", "alice"])
def test_the_probe_publishes_into_no_directory_someone_else_owns(shared_tmp, uid):
    """In a shared, sticky probe directory mallory made `<uid>` first, owner-only: a probe
    in a root process (which could write there) or in alice's refuses it, rather than put
    its records and snapshots where mallory reads them."""
    base = shared_tmp / "probe"
    base.mkdir()
    base.chmod(0o1777)
    theirs = base / str(uid)
    theirs.mkdir(mode=0o700)
    os.chown(theirs, MALLORY, MALLORY)
    proc = probe_process(uid, base, "publish")
    out, err = proc.communicate(timeout=60)
    assert out.startswith("PermissionError"), (out, err)
    assert os.listdir(theirs) == []
