"""Flush and snapshot carried out by the real probe in a real child process, through the
request channel, triggered by the Remediator. The child's torch is a CPU stand-in with the
allocator API the probe uses; tests/gpu/test_remediation_gpu.py does the same on a GPU."""

from __future__ import annotations

import os
import pickle
import stat
import subprocess
import sys
import time

import psutil
import pytest

from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, ProbeSample, ProcessSample, Tick
from tests.helpers import REPO
from tests.remediation_helpers import run_probe_actions

MIB = 1024**2
UUID = "GPU-probe-test"

# A process whose "torch" holds 600 MiB reserved, 500 MiB of it cached and free.
CHILD = """
import sys, time, types
MIB = 1024 ** 2

class Cuda:
    reserved = 600 * MIB
    def is_initialized(self): return True
    def is_available(self): return True
    def device_count(self): return 1
    def current_device(self): return 0
    def memory_stats(self, device=0):
        return {"allocated_bytes.all.current": 100 * MIB,
                "reserved_bytes.all.current": self.reserved,
                "inactive_split_bytes.all.current": 0, "num_alloc_retries": 0,
                "num_ooms": 0, "segment.all.current": 2}
    def memory_snapshot(self, *args, **kwargs):
        segs = [{"device": 0, "address": 0, "total_size": 100 * MIB,
                 "allocated_size": 100 * MIB, "segment_type": "large",
                 "blocks": [{"size": 100 * MIB, "state": "active_allocated"}]}]
        if self.reserved > 100 * MIB:
            segs.append({"device": 0, "address": 1 << 40, "total_size": 500 * MIB,
                         "allocated_size": 0, "segment_type": "large",
                         "blocks": [{"size": 500 * MIB, "state": "inactive"}]})
        return segs
    def empty_cache(self): self.reserved = 100 * MIB
    def get_device_properties(self, index): return types.SimpleNamespace(name="stand-in")

torch = types.ModuleType("torch")
torch.__version__ = "0.0-cpu-stand-in"
torch.cuda = Cuda()
torch.cuda.memory = types.SimpleNamespace(
    _snapshot=lambda *a, **k: {"segments": torch.cuda.memory_snapshot(),
                               "device_traces": [[{"action": "alloc", "size": MIB}]]},
    _record_memory_history=lambda *a, **k: None)
sys.modules["torch"] = torch
import gpuwatch.probe
assert gpuwatch.probe.current() is not None, "probe did not start"
print("ready", flush=True)
time.sleep(120)
"""


@pytest.fixture
def probed(tmp_path):
    probe_dir = tmp_path / "probe"
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUWATCH_PROBE_DIR": str(probe_dir),
           "GPUWATCH_PROBE_INTERVAL_SECONDS": "0.2",
           "GPUWATCH_PROBE_REQUEST_POLL_SECONDS": "0.05"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        record = probe_dir / str(os.geteuid()) / f"{proc.pid}.json"
        deadline = time.monotonic() + 10
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert record.exists(), "the probe never published"
        yield proc.pid, psutil.Process(proc.pid).create_time(), str(probe_dir)
    finally:
        proc.kill()
        proc.wait()


def _snap(pid, ct):
    gpu = GpuSample(index=0, uuid=UUID, name="NVIDIA A100-SXM4-80GB",
                    memory_total_bytes=80 * 1024**3, memory_used_bytes=70 * 1024**3,
                    processes=[ProcessSample(pid=pid, name="python", create_time=ct,
                                             used_memory_bytes=600 * MIB)])
    return Snapshot(tick=Tick(t=1.0, gpus=[gpu], probes=[ProbeSample(pid=pid, create_time=ct)]))


def _run(tmp_path, probe_dir, snap, actions, history=False):
    pid = snap.tick.gpus[0].processes[0].pid
    return run_probe_actions(tmp_path, probe_dir, snap, UUID, pid, actions, timeout=30,
                             history=history)


def test_probe_snapshot_and_flush_in_a_real_process(tmp_path, probed):
    pid, ct, probe_dir = probed
    out = _run(tmp_path, probe_dir, _snap(pid, ct), ["snapshot", "flush"])
    assert [(a.action, a.result) for a in out] == [("snapshot", "ok"), ("flush", "ok")], out
    snap_detail, flush_detail = out[0].detail, out[1].detail
    pickle_path = snap_detail["allocator_snapshot"]
    assert os.path.dirname(pickle_path) == str(tmp_path / "snaps")
    assert pickle_path.endswith(f"-pid{pid}-uid{os.getuid()}-allocator.pickle")
    assert stat.S_IMODE(os.stat(pickle_path).st_mode) == 0o600
    with open(pickle_path, "rb") as f:
        data = pickle.load(f)
    assert len(data["segments"]) == snap_detail["segments"] == 2
    assert data["device_traces"] == [[]]  # history not asked for
    assert os.path.exists(snap_detail["nvml_state"])
    assert flush_detail["via"] == "probe"
    assert flush_detail["released_bytes"] == 500 * MIB
    assert flush_detail["reserved_after"] == 100 * MIB


def test_probe_snapshot_with_history(tmp_path, probed):
    pid, ct, probe_dir = probed
    out = _run(tmp_path, probe_dir, _snap(pid, ct), ["snapshot:history"])
    assert [(a.action, a.result) for a in out] == [("snapshot", "ok")], out
    with open(out[0].detail["allocator_snapshot"], "rb") as f:
        data = pickle.load(f)
    assert data["device_traces"][0][0]["action"] == "alloc"
    assert out[0].detail["history"] is True
