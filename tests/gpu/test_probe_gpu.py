"""The probe in a real PyTorch process on a real GPU (skipped without one).

A child allocates and frees in a fragmenting pattern (NOTES.md: 120 blocks of 1-7 MiB,
every other one freed); what the daemon's reader and analyzer make of its probe must match
torch.cuda.memory_stats() and torch.cuda.memory_snapshot() in that process; a flush through
the request channel must release reserved memory that NVML then stops counting; a snapshot
must be a pickle with segments.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import queue
import subprocess
import sys
import threading
import time

import pytest

from gpuwatch.model import Tick
from gpuwatch.probe_channel.requests import send_request, wait_result
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.fragmentation import FragmentationAnalyzer, locate
from gpuwatch.sources.probes import read_probes
from tests.helpers import child_env, wait_until

pytestmark = pytest.mark.gpu

MIB = 1024**2

CHILD = r"""
import json, os, sys
import torch
import gpuwatch.probe as probe  # before CUDA is up: the probe waits for it

torch.cuda.init()
MIB = 1024 ** 2
held = []


def state():
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats(0)
    segs = [s for s in torch.cuda.memory_snapshot() if s.get("device", 0) == 0]
    free = [b["size"] for s in segs for b in s["blocks"] if b["state"] == "inactive"]
    split = sum(b["size"] for s in segs if len(s["blocks"]) > 1 for b in s["blocks"]
                if b["state"] == "inactive")
    agent = probe.current()
    return {"allocated": st["allocated_bytes.all.current"],
            "reserved": st["reserved_bytes.all.current"],
            "inactive_split": st["inactive_split_bytes.all.current"],
            "snap_reserved": sum(s["total_size"] for s in segs), "snap_split": split,
            "free_blocks": len(free), "total_free": sum(free),
            "largest": max(free, default=0), "smallest": min(free, default=None),
            "publish_seconds": agent.last_publish_seconds if agent else None}


print(json.dumps({"pid": os.getpid(), "agent": probe.current() is not None}), flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "fragment":
        blocks = [torch.empty((1 + i % 7) * MIB, dtype=torch.uint8, device="cuda")
                  for i in range(120)]
        held[:] = blocks[1::2]
        del blocks
    elif cmd == "free_all":
        held.clear()
    elif cmd == "exit":
        break
    print(json.dumps(state()), flush=True)
"""


def _torch_cuda() -> bool:
    res = subprocess.run([sys.executable, "-c",
                          "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                         capture_output=True, timeout=120)
    return res.returncode == 0


class TorchHost:
    def __init__(self, tmp_path):
        self.probe_dir = tmp_path / "probe"
        env = child_env(**{"GPUWATCH_PROBE_DIR": str(self.probe_dir),
               "GPUWATCH_PROBE_INTERVAL_SECONDS": "0.2",
               "GPUWATCH_PROBE_REQUEST_POLL_SECONDS": "0.05"})
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        hello = self.read()
        self.pid, self.agent = hello["pid"], hello["agent"]

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read(self) -> dict:
        line = self.lines.get(timeout=300)
        assert line is not None, f"torch child exited with {self.proc.wait()}"
        return json.loads(line)

    def send(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.read()

    def sample(self, **want):
        def match():
            for s in read_probes(str(self.probe_dir), time.time()):
                if s.pid == self.pid and all(getattr(s, k) == v for k, v in want.items()):
                    return s
            return None
        return wait_until(match, timeout=30, interval=0.1, what=f"a probe sample with {want}")

    def ask(self, action: str, params=None) -> dict:
        rid = send_request(str(self.probe_dir), self.pid, action, params)
        return asyncio.run(wait_result(str(self.probe_dir), self.pid, rid, 60))

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def host(tmp_path):
    if not _torch_cuda():
        pytest.skip("torch with CUDA is not installed here")
    h = TorchHost(tmp_path)
    yield h
    h.close()


@pytest.fixture
def nvml():
    from gpuwatch.sources.nvml import NvmlBackend

    backend = NvmlBackend()
    backend.open()
    yield backend
    backend.close()


def _nvml_used(backend, pid) -> tuple[list, int]:
    def find():
        gpus = backend.sample(time.time())
        for g in gpus:
            for p in g.processes:
                if p.pid == pid and p.used_memory_bytes:
                    return gpus, p.used_memory_bytes
        return None
    return wait_until(find, timeout=30, interval=0.5, what=f"pid {pid} in NVML's list")


def test_reader_and_analyzer_match_the_process(host, nvml):
    assert host.agent
    st = host.send("fragment")
    print("in the process:", st)
    assert st["inactive_split"] > 0 and st["free_blocks"] > 1
    s = host.sample(allocated_bytes=st["allocated"])
    assert (s.reserved_bytes, s.inactive_split_bytes) == (st["reserved"], st["inactive_split"])
    assert (s.free_blocks, s.total_free_bytes, s.largest_free_block_bytes,
            s.smallest_free_block_bytes) == (st["free_blocks"], st["total_free"], st["largest"],
                                             st["smallest"])

    gpus, used = _nvml_used(nvml, host.pid)
    tick = Tick(t=time.time(), gpus=gpus, probes=[s])
    [(_, gpu)] = locate(tick)
    derived = Derived()
    FragmentationAnalyzer().update(tick, derived, Conditions())
    ps = derived.processes[(gpu.uuid, host.pid)]
    assert ps.fragmentation_ratio == pytest.approx(st["inactive_split"] / st["reserved"])
    # ... which is what the snapshot shows too
    assert ps.fragmentation_ratio == pytest.approx(st["snap_split"] / st["snap_reserved"],
                                                   rel=0.01)
    assert ps.largest_free_share == pytest.approx(st["largest"] / st["total_free"])
    assert ps.free_blocks_per_mb == pytest.approx(st["free_blocks"] / (st["total_free"] / MIB))
    assert ps.unattributed_bytes == used - st["reserved"]
    print(f"fragmentation ratio {ps.fragmentation_ratio:.3f}, largest free share "
          f"{ps.largest_free_share:.3f}, probe publish {st['publish_seconds']} s CPU")


def test_flush_through_the_channel_releases_what_nvml_counted(host, nvml):
    host.send("fragment")
    st = host.send("free_all")
    assert st["allocated"] == 0 and st["reserved"] > 100 * MIB
    host.sample(reserved_bytes=st["reserved"])
    _, used_before = _nvml_used(nvml, host.pid)
    res = host.ask("flush")
    assert res["ok"] is True, res
    assert res["reserved_before"] == st["reserved"]
    assert res["released_bytes"] == res["reserved_before"] - res["reserved_after"]
    assert res["reserved_after"] == 0
    host.sample(reserved_bytes=0)

    def dropped():
        _, used = _nvml_used(nvml, host.pid)
        return used if used_before - used >= 0.9 * res["released_bytes"] else None
    used_after = wait_until(dropped, timeout=30, interval=0.5, what="NVML to see the release")
    print(f"NVML used {used_before} -> {used_after}; probe released {res['released_bytes']}")


def test_snapshot_through_the_channel_is_a_pickle_with_segments(host, tmp_path):
    host.send("fragment")
    host.sample()
    res = host.ask("snapshot")
    assert res["ok"] is True, res
    assert os.path.dirname(res["path"]) == str(host.probe_dir / str(os.geteuid()))
    assert os.stat(res["path"]).st_mode & 0o777 == 0o600
    with open(res["path"], "rb") as f:
        snap = pickle.load(f)
    assert snap["segments"] and len(snap["segments"]) == res["segments"]
    assert all("total_size" in seg and "blocks" in seg for seg in snap["segments"])
