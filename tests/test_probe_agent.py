"""The probe inside a real process: a child Python with a small fake `torch` (the allocator
surface the probe reads) on its PYTHONPATH, driven line by line over stdin/stdout."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import queue
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import gpuwatch.probe_channel.protocol as protocol
from gpuwatch.probe_channel.config import ProbeConfig
from gpuwatch.probe_channel.requests import ProbeUnavailableError, send_request, wait_result
from gpuwatch.sources.probes import ProbeReader, prepare_probe_dir, read_probes
from tests.helpers import REPO, wait_until

MIB = 1024 * 1024
ROOT = os.geteuid() == 0

# A stand-in for torch: the allocator surface the probe reads, nothing more.
FAKE_TORCH = {
"torch/__init__.py": '''
"""A stand-in for torch: only the allocator surface gpuwatch.probe reads."""
import os
__version__ = "0.0+fake"
from types import SimpleNamespace as _NS  # noqa: E402
# FAKE_TORCH_CPU_BUILD=1: a torch built without CUDA, as vLLM's CPU backend runs.
version = _NS(cuda=None if os.environ.get("FAKE_TORCH_CPU_BUILD") == "1" else "12.8")
from torch import cuda  # noqa: E402
''',
"torch/cuda/__init__.py": '''
import copy
import os
import threading
from types import SimpleNamespace

from torch.cuda import memory  # noqa: F401

MIB = 1024 * 1024
SEGMENT = 20 * MIB
_lock = threading.RLock()
_initialized = False
_devices = int(os.environ.get("FAKE_TORCH_DEVICES", "1"))
_broken = os.environ.get("FAKE_TORCH_BROKEN") == "1"
_segments = []
_ever = [0] * _devices
_counters = {"num_alloc_retries": 0, "num_ooms": 0}
trace = []
recording = [0]


def init():
    global _initialized
    _initialized = True


def is_available():
    return True


def is_initialized():
    return _initialized


def device_count():
    return _devices


def get_device_properties(i):
    return SimpleNamespace(uuid=f"00000000-0000-0000-0000-{i:012d}", name="Fake GPU")


def _record(action, size):
    if recording[0]:
        trace.append({"action": action, "size": size, "frames": []})
        del trace[:-recording[0]]


def alloc(size, device=0):
    """First fit in a free block, else a new segment (2 MiB-rounded, at least SEGMENT)."""
    with _lock:
        for seg in _segments:
            if seg["device"] != device:
                continue
            for i, b in enumerate(seg["blocks"]):
                if b["state"] == "inactive" and b["size"] >= size:
                    rest = b["size"] - size
                    b.update(size=size, state="active_allocated")
                    if rest:
                        seg["blocks"].insert(i + 1, {"size": rest, "state": "inactive"})
                    _record("alloc", size)
                    return b
        total = max(SEGMENT, -(-size // (2 * MIB)) * 2 * MIB)
        seg = {"device": device, "total_size": total,
               "blocks": [{"size": size, "state": "active_allocated"}]}
        if total > size:
            seg["blocks"].append({"size": total - size, "state": "inactive"})
        _segments.append(seg)
        _ever[device] += total
        _record("segment_alloc", total)
        return seg["blocks"][0]


def free(block):
    with _lock:
        for seg in _segments:
            for b in seg["blocks"]:
                if b is block:
                    b["state"] = "inactive"
                    merged = []
                    for x in seg["blocks"]:
                        if merged and merged[-1]["state"] == x["state"] == "inactive":
                            merged[-1]["size"] += x["size"]
                        else:
                            merged.append(x)
                    seg["blocks"][:] = merged
                    _record("free_completed", b["size"])
                    return


def memory_stats(device=None):
    if not _initialized:
        return {}
    if _broken:
        raise RuntimeError("allocator stats unavailable")
    device = 0 if device is None else device
    with _lock:
        segs = [s for s in _segments if s["device"] == device]
        reserved = sum(s["total_size"] for s in segs)
        allocated = sum(b["size"] for s in segs for b in s["blocks"]
                        if b["state"] != "inactive")
        split = sum(b["size"] for s in segs if len(s["blocks"]) > 1 for b in s["blocks"]
                    if b["state"] == "inactive")
        return {"allocated_bytes.all.current": allocated,
                "reserved_bytes.all.current": reserved,
                "reserved_bytes.all.peak": reserved,
                "reserved_bytes.all.allocated": _ever[device],
                "inactive_split_bytes.all.current": split,
                "segment.all.current": len(segs),
                **_counters}


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def memory_snapshot(mempool_id=None, include_traces=True):
    with _lock:
        return copy.deepcopy(_segments)


def empty_cache():
    with _lock:
        _segments[:] = [s for s in _segments
                        if any(b["state"] != "inactive" for b in s["blocks"])]
''',
"torch/cuda/memory.py": '''
import torch.cuda as _cuda


def _snapshot(device=None):
    return {"segments": _cuda.memory_snapshot(),
            "device_traces": [list(_cuda.trace)] + [[] for _ in range(_cuda._devices - 1)]}


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=1000):
    _cuda.recording[0] = max_entries if enabled else 0
''',
}

CHILD = r"""
import json, os, sys
import torch
if os.environ.get("FAKE_CUDA_INIT", "1") == "1":
    torch.cuda.init()
if os.environ.get("RUN_AS_UID"):
    # everything the probe needs is imported before we lose access to the interpreter's home
    import gpuwatch.probe_agent.agent, gpuwatch.probe_channel.config, pickle  # noqa: E401
    import gpuwatch.probe_agent as probe
    os.setgid(int(os.environ["RUN_AS_UID"]))
    os.setuid(int(os.environ["RUN_AS_UID"]))
    probe.start()  # as that user
else:
    import gpuwatch.probe as probe
MIB = 1024 * 1024
held = []


def summary():
    free = [b["size"] for s in torch.cuda.memory_snapshot() for b in s["blocks"]
            if b["state"] == "inactive"]
    return {"free_blocks": len(free), "total_free": sum(free),
            "largest": max(free, default=0), "smallest": min(free, default=None)}


def reply(**kw):
    print(json.dumps(kw), flush=True)


reply(ready=True, pid=os.getpid(), agent=probe.current() is not None)
for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "fragment":  # NOTES.md: 120 allocations of 1-7 MiB, every other one freed
        blocks = [torch.cuda.alloc((1 + i % 7) * MIB) for i in range(120)]
        for b in blocks[::2]:
            torch.cuda.free(b)
        held[:] = blocks[1::2]
    elif cmd == "free_all":
        for b in held:
            torch.cuda.free(b)
        held.clear()
    elif cmd == "init":
        torch.cuda.init()
    elif cmd == "history":
        torch.cuda.memory._record_memory_history("all", max_entries=int(args[0]))
    elif cmd == "exit":
        break
    stats = torch.cuda.memory_stats(0) if os.environ.get("FAKE_TORCH_BROKEN") != "1" else {}
    reply(cmd=cmd, stats=stats, snap=summary() if torch.cuda.is_initialized() else None,
          agent=probe.current() is not None)
"""



def fake_torch(where: Path) -> Path:
    for rel, text in FAKE_TORCH.items():
        path = where / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return where


@pytest.fixture
def site(tmp_path):
    return fake_torch(tmp_path / "site")


def child_env(site: Path, probe_dir: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    if probe_dir is not None:
        env["GPUWATCH_PROBE_DIR"] = str(probe_dir)
    env.setdefault("GPUWATCH_PROBE_INTERVAL_SECONDS", "0.1")
    env.setdefault("GPUWATCH_PROBE_REQUEST_POLL_SECONDS", "0.05")
    env["GPUWATCH_PROBE_MAX_OVERHEAD_RATIO"] = "1"
    env.update(extra)
    return env


class Host:
    """A child process with the probe, answering one JSON line per command."""

    def __init__(self, tmp_path: Path, site: Path, probe_dir: Path | None, **env: str):
        script = tmp_path / "host.py"
        script.write_text(CHILD)
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=child_env(site, probe_dir, **env),
            cwd=str(tmp_path))
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        hello = self.read()
        self.pid = hello["pid"]
        self.agent = hello["agent"]

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read(self, timeout: float = 20.0) -> dict:
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise RuntimeError(f"host exited: {self.proc.wait()} {self.proc.stderr.read()}")
        return json.loads(line)

    def send(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.read()

    def exit(self, timeout: float = 20.0) -> int:
        self.proc.stdin.write("exit\n")
        self.proc.stdin.close()
        return self.proc.wait(timeout)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.poll() is not None else ""

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def hosts(tmp_path, site):
    started: list[Host] = []

    def start(probe_dir: Path | None = None, **env: str) -> Host:
        h = Host(tmp_path, site, probe_dir if probe_dir is not None else tmp_path / "probe",
                 **env)
        started.append(h)
        return h

    yield start
    for h in started:
        h.kill()


def latest(probe_dir: Path, pid: int, **want):
    """The first sample for pid whose fields equal want (waits for the probe to publish)."""
    def match():
        for s in read_probes(str(probe_dir), time.time()):
            if s.pid == pid and all(getattr(s, k) == v for k, v in want.items()):
                return s
        return None
    return wait_until(match, timeout=20, interval=0.05, what=f"a probe sample with {want}")


def ask(probe_dir: Path, pid: int, action: str, params=None, timeout: float = 20.0) -> dict:
    rid = send_request(str(probe_dir), pid, action, params)
    return asyncio.run(wait_result(str(probe_dir), pid, rid, timeout))


def run_python(site: Path, code: str, probe_dir: Path, **env: str) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(site, probe_dir, **env), timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


# -- publishing --------------------------------------------------------------------------

def test_publishes_the_allocator_state_of_its_process(hosts, tmp_path):
    host = hosts()
    assert host.agent, "import gpuwatch.probe started the probe"
    st = host.send("fragment")
    stats, snap = st["stats"], st["snap"]
    s = latest(tmp_path / "probe", host.pid, allocated_bytes=stats["allocated_bytes.all.current"])
    assert s.reserved_bytes == stats["reserved_bytes.all.current"]
    assert s.inactive_split_bytes == stats["inactive_split_bytes.all.current"] > 0
    assert (s.free_blocks, s.total_free_bytes, s.largest_free_block_bytes,
            s.smallest_free_block_bytes) == (snap["free_blocks"], snap["total_free"],
                                             snap["largest"], snap["smallest"])
    assert s.device == 0 and s.num_ooms == 0 and s.segments == stats["segment.all.current"]
    # owner-only: the user's directory 0700, the record 0600, both ours
    d = tmp_path / "probe" / str(os.geteuid())
    rec = d / f"{host.pid}.json"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE(rec.stat().st_mode) == 0o600
    assert rec.stat().st_uid == d.stat().st_uid == os.geteuid()
    raw = json.loads(rec.read_text())
    assert raw["samples"][0]["gpu_uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert not [p for p in d.iterdir() if p.name.startswith(".")]  # no temporary left


def first_status(hosts, tmp_path, **env: str):
    """(host, status of its first record), checking that no samples reach the daemon."""
    host = hosts(**env)
    rec = tmp_path / "probe" / str(os.geteuid()) / f"{host.pid}.json"
    wait_until(rec.exists, timeout=20, what="the first record")
    assert read_probes(str(tmp_path / "probe"), time.time()) == []
    return host, json.loads(rec.read_text())["status"]


def test_says_so_when_torch_is_built_without_cuda(hosts, tmp_path):
    assert first_status(hosts, tmp_path, FAKE_TORCH_CPU_BUILD="1")[1] == "no_cuda"


def test_waits_for_the_host_to_initialise_cuda(hosts, tmp_path):
    host, status = first_status(hosts, tmp_path, FAKE_CUDA_INIT="0")
    assert status == "cuda_not_initialized"
    host.send("init")
    st = host.send("fragment")
    latest(tmp_path / "probe", host.pid, reserved_bytes=st["stats"]["reserved_bytes.all.current"])


def test_a_failing_allocator_never_reaches_the_host(hosts, tmp_path):
    host = hosts(FAKE_TORCH_BROKEN="1")
    assert host.send("fragment")["cmd"] == "fragment"
    rec = tmp_path / "probe" / str(os.geteuid()) / f"{host.pid}.json"
    wait_until(lambda: rec.exists() and json.loads(rec.read_text())["status"].startswith(
        "error: RuntimeError"), timeout=20, what="an error status")
    assert read_probes(str(tmp_path / "probe"), time.time()) == []
    assert host.send("free_all")["cmd"] == "free_all"
    assert host.exit() == 0


def test_stops_cleanly_and_removes_its_record(hosts, tmp_path):
    host = hosts()
    host.send("fragment")
    rec = tmp_path / "probe" / str(os.geteuid()) / f"{host.pid}.json"
    wait_until(rec.exists, timeout=20, what="the record")
    assert host.exit() == 0
    assert not rec.exists()
    assert "Traceback" not in host.stderr()


# -- requests ----------------------------------------------------------------------------

def test_flush_returns_cached_memory(hosts, tmp_path):
    host = hosts()
    host.send("fragment")
    st = host.send("free_all")
    reserved = st["stats"]["reserved_bytes.all.current"]
    assert reserved > 0 and st["stats"]["allocated_bytes.all.current"] == 0
    latest(tmp_path / "probe", host.pid, reserved_bytes=reserved)
    res = ask(tmp_path / "probe", host.pid, "flush")
    assert res["ok"] is True, res
    assert (res["released_bytes"], res["reserved_before"], res["reserved_after"]) == \
        (reserved, reserved, 0)
    assert host.send("noop")["stats"]["reserved_bytes.all.current"] == 0
    latest(tmp_path / "probe", host.pid, reserved_bytes=0)  # republished at once
    d = tmp_path / "probe" / str(os.geteuid())
    assert not [p.name for p in d.iterdir() if p.name.startswith(("req-", "res-"))]


def test_snapshot_writes_a_pickle_the_visualizer_opens(hosts, tmp_path):
    host = hosts()
    host.send("history 1000")
    host.send("fragment")
    latest(tmp_path / "probe", host.pid)
    res = ask(tmp_path / "probe", host.pid, "snapshot")
    assert res["ok"] is True, res
    path = Path(res["path"])
    # Always in its own directory, under the one name the daemon expects.
    assert path.parent == tmp_path / "probe" / str(os.geteuid())
    assert res["name"] == path.name == f"gpuwatch-probe-{host.pid}-{path.name[-23:-7]}.pickle"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with path.open("rb") as f:
        snap = pickle.load(f)
    assert len(snap["segments"]) == res["segments"] > 0
    assert not any(snap["device_traces"]) and res["history"] is False  # not asked for
    res = ask(tmp_path / "probe", host.pid, "snapshot", {"history": True})
    with open(res["path"], "rb") as f:
        snap = pickle.load(f)
    assert res["history"] is True and res["history_entries"] == len(snap["device_traces"][0]) > 0


def test_snapshot_ignores_a_directory_it_is_offered(hosts, tmp_path):
    host = hosts()
    host.send("fragment")
    latest(tmp_path / "probe", host.pid)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = ask(tmp_path / "probe", host.pid, "snapshot", {"dir": str(elsewhere)})
    assert res["ok"] is True
    assert Path(res["path"]).parent == tmp_path / "probe" / str(os.geteuid())
    assert list(elsewhere.iterdir()) == []


def test_bad_requests(hosts, tmp_path):
    host = hosts()
    host.send("fragment")
    probe_dir = tmp_path / "probe"
    latest(probe_dir, host.pid)
    with pytest.raises(ValueError):
        send_request(str(probe_dir), host.pid, "reboot")
    with pytest.raises(ValueError):
        send_request(str(probe_dir), host.pid, "flush", {"x": object()})
    with pytest.raises(ProbeUnavailableError):
        send_request(str(probe_dir), os.getpid(), "flush")  # no probe in this process
    # a request file that is not JSON gets an error answer
    d = probe_dir / str(os.geteuid())
    (d / protocol.request_name(host.pid, "deadbeefdeadbeef")).write_text("{oops")
    res = asyncio.run(wait_result(str(probe_dir), host.pid, "deadbeefdeadbeef", 20))
    assert res["ok"] is False and "invalid request" in res["error"]
    with pytest.raises(ValueError):
        asyncio.run(wait_result(str(probe_dir), host.pid, "../../etc/passwd", 1))


def test_unanswered_request_times_out_and_is_withdrawn(hosts, tmp_path):
    host = hosts(GPUWATCH_PROBE_REQUEST_POLL_SECONDS="30")
    host.send("fragment")
    latest(tmp_path / "probe", host.pid)
    rid = send_request(str(tmp_path / "probe"), host.pid, "flush")
    with pytest.raises(TimeoutError):
        asyncio.run(wait_result(str(tmp_path / "probe"), host.pid, rid, 0.3))
    d = tmp_path / "probe" / str(os.geteuid())
    assert not (d / protocol.request_name(host.pid, rid)).exists()


@pytest.mark.skipif(not ROOT, reason="needs root to hand files to another uid")
def test_requests_from_an_untrusted_uid_are_ignored(hosts, tmp_path):
    host = hosts()
    host.send("fragment")
    st = host.send("free_all")
    probe_dir = tmp_path / "probe"
    latest(probe_dir, host.pid)
    d = probe_dir / str(os.geteuid())
    req = d / protocol.request_name(host.pid, "0123456789abcdef")
    tmp = d / ".untrusted.tmp"  # handed over before it appears: the probe polls meanwhile
    tmp.write_text(json.dumps({"id": "0123456789abcdef", "pid": host.pid, "action": "flush",
                               "t": time.time()}))
    os.chown(tmp, 4321, 4321)
    tmp.rename(req)
    wait_until(lambda: not req.exists(), timeout=20, what="the probe to take the file")
    with pytest.raises(TimeoutError):
        asyncio.run(wait_result(str(probe_dir), host.pid, "0123456789abcdef", 0.5))
    assert host.send("noop")["stats"]["reserved_bytes.all.current"] == \
        st["stats"]["reserved_bytes.all.current"] > 0  # nothing was flushed


@pytest.mark.skipif(not ROOT, reason="needs root to run the host as another user")
def test_root_daemon_and_a_probe_of_another_user(tmp_path, site):
    # Directories the other user can reach: a fresh one under the system temp directory.
    top = Path(tempfile.mkdtemp(prefix="gpuwatch-test-"))
    try:
        top.chmod(0o755)
        probe_dir = top / "probe"
        prepare_probe_dir(str(probe_dir))  # as root: root's, nobody else may add to it
        st = probe_dir.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
        host = Host(tmp_path, site, probe_dir, RUN_AS_UID="4321")
        try:
            host.send("fragment")
            st = host.send("free_all")
            d = probe_dir / "4321"
            time.sleep(0.5)
            assert not d.exists()  # the probe waits for the daemon to make its directory
            reader = ProbeReader(str(probe_dir))
            reader.read(time.time(), [host.pid], stale_after=30)  # it is on a GPU: made
            assert (d.stat().st_uid, stat.S_IMODE(d.stat().st_mode)) == (4321, 0o700)
            s = latest(probe_dir, host.pid)
            assert s.reserved_bytes == st["stats"]["reserved_bytes.all.current"]
            res = ask(probe_dir, host.pid, "snapshot")
            assert res["ok"] and Path(res["path"]).parent == d
            assert Path(res["path"]).stat().st_uid == 4321
            res = ask(probe_dir, host.pid, "flush")
            assert res["ok"] and res["released_bytes"] == s.reserved_bytes > 0
        finally:
            host.kill()
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)


# -- when the probe starts -----------------------------------------------------------------

def test_import_starts_it(site, tmp_path):
    probe_dir = tmp_path / "probe"
    check = "import gpuwatch.probe as p; print(p.current() is not None)"
    assert run_python(site, check, probe_dir) == "True"
    assert run_python(site, "import torch; " + check, probe_dir) == "True"
    assert run_python(site, "from gpuwatch.probe import current; print(current() is not None)",
                      probe_dir) == "True"
    assert run_python(site, check, probe_dir, GPUWATCH_PROBE_ENABLED="0") == "False"
    # a program without torch: the probe waits, writing nothing
    fresh = tmp_path / "fresh"
    code = f"import time, os; {check}; time.sleep(0.5); print(os.path.exists({str(fresh)!r}))"
    assert run_python(site, code, fresh).split() == ["True", "False"]


def test_importing_anything_else_starts_nothing(site, tmp_path):
    # Even opted in and with torch importable: only `import gpuwatch.probe` or start() runs one.
    modules = ["gpuwatch.probe_channel", "gpuwatch.probe_channel.config",
               "gpuwatch.probe_channel.protocol", "gpuwatch.probe_channel.requests",
               "gpuwatch.probe_agent", "gpuwatch.probe_agent.agent",
               "gpuwatch.probe_agent.stats", "gpuwatch.probe_agent.actions",
               "gpuwatch.vllm_plugin", "gpuwatch.config", "gpuwatch.sources.probes",
               "gpuwatch.signals.pipeline", "gpuwatch.exporter.families.allocator",
               "gpuwatch.remediation.hooks.probe_channel", "gpuwatch.daemon", "gpuwatch.cli"]
    code = (f"import sys, threading; import {', '.join(modules)}; "
            "import gpuwatch.probe_agent as a; "
            "print('torch' in sys.modules, 'gpuwatch.probe' in sys.modules, "
            "a.current() is not None, threading.active_count())")
    assert run_python(site, code, tmp_path / "probe",
                      GPUWATCH_PROBE_ENABLED="1") == "False False False 1"
    assert not (tmp_path / "probe").exists()


def test_vllm_plugin_starts_it_only_when_opted_in(site, tmp_path):
    code = ("import torch, gpuwatch.vllm_plugin as plugin, gpuwatch.probe_agent as a; "
            "plugin.register(); plugin.register(); print(a.current() is not None)")
    assert run_python(site, code, tmp_path / "probe") == "False"
    assert run_python(site, code, tmp_path / "probe", GPUWATCH_PROBE_ENABLED="0") == "False"
    assert run_python(site, code, tmp_path / "probe", GPUWATCH_PROBE_ENABLED="1") == "True"


def test_a_forked_child_gets_its_own_probe(site, tmp_path):
    code = """
import os, gpuwatch.probe as p
parent = p.current()
pid = os.fork()
if pid == 0:
    fresh = p.current() is None
    mine = p.start()
    ok = fresh and mine is not None and mine.pid == os.getpid() and mine is not parent
    p.stop()
    os._exit(0 if ok else 1)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), p.current() is parent)
"""
    assert run_python(site, code, tmp_path / "probe") == "0 True"


# -- cost ----------------------------------------------------------------------------------

def test_a_costly_publish_stretches_the_interval(tmp_path, monkeypatch):
    from gpuwatch.probe_agent.agent import Agent

    agent = Agent(ProbeConfig(dir=str(tmp_path / "probe"), interval_seconds=0.1,
                              max_overhead_ratio=0.01))
    collect = agent.collect

    def slow():
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.03:  # 30 ms of CPU
            pass
        return collect()

    monkeypatch.setattr(agent, "collect", slow)
    agent.publish()
    assert agent.last_publish_seconds >= 0.03
    assert agent.interval >= 0.03 / 0.01  # at most 1 % of the time
    agent.stop()
    assert not (tmp_path / "probe" / str(os.geteuid()) / f"{os.getpid()}.json").exists()


def test_start_with_other_settings_restarts_the_probe(site, tmp_path):
    code = """
from gpuwatch.probe import ProbeConfig, current, start
first = current()
again = start()
other = start(ProbeConfig(dir=first.config.dir, interval_seconds=7.0))
print(first is not None, again is first, other is not first, current().interval, first.running)
"""
    assert run_python(site, code, tmp_path / "probe") == "True True True 7.0 False"
