"""Remediation on a real GPU: the probe's empty_cache() releases reserved memory that NVML
then stops counting, and the allocator snapshot pickle loads and has segments.

The process acted on is a real PyTorch child; the tick the Remediator judges comes from the
real NVML backend (so the pid and its create time are what the daemon would see)."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time

import pytest

from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import ProbeSample, Tick
from tests.helpers import child_env
from tests.remediation_helpers import run_probe_actions

pytestmark = pytest.mark.gpu

GIB = 1024**3

# 2 GiB allocated then freed (cached by the allocator), plus 120 small blocks with every
# other one freed (a fragmented cache, as in NOTES.md).
CHILD = """
import time, torch
torch.cuda.init()
big = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
small = [torch.empty((i % 7 + 1) * 1024**2, dtype=torch.uint8, device="cuda")
         for i in range(120)]
del small[::2]
del big
torch.cuda.synchronize()
import gpuwatch.probe
assert gpuwatch.probe.current() is not None
print("ready", torch.cuda.memory_reserved(), flush=True)
time.sleep(600)
"""


def _torch_cuda() -> bool:
    res = subprocess.run([sys.executable, "-c",
                          "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                         capture_output=True, timeout=120)
    return res.returncode == 0


@pytest.fixture
def torch_child(tmp_path):
    if not _torch_cuda():
        pytest.skip("torch with CUDA is not installed here")
    probe_dir = tmp_path / "probe"
    env = child_env(**{"GPUWATCH_PROBE_DIR": str(probe_dir),
           "GPUWATCH_PROBE_INTERVAL_SECONDS": "0.5",
           "GPUWATCH_PROBE_REQUEST_POLL_SECONDS": "0.05"})
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", "the torch child did not start"
        assert int(line[1]) >= 2 * GIB
        yield proc.pid, str(probe_dir)
    finally:
        proc.kill()
        proc.wait()


def _tick(backend, pid):
    """A tick from the real NVML backend, once the child shows up in its process list."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        gpus = backend.sample(time.time())
        for gpu in gpus:
            for p in gpu.processes:
                if p.pid == pid and p.used_memory_bytes:
                    return Tick(t=time.time(), gpus=gpus,
                                probes=[ProbeSample(pid=pid, create_time=p.create_time)]), gpu, p
        time.sleep(0.5)
    pytest.fail(f"pid {pid} never appeared in NVML's process list (PID namespace?)")


def test_snapshot_then_empty_cache_through_the_probe(tmp_path, torch_child):
    from gpuwatch.sources.nvml import NvmlBackend

    pid, probe_dir = torch_child
    backend = NvmlBackend()
    backend.open()
    try:
        tick, gpu, proc = _tick(backend, pid)
        used_before = proc.used_memory_bytes
        out = run_probe_actions(tmp_path, probe_dir, Snapshot(tick=tick), gpu.uuid, pid,
                                ["snapshot", "flush"], timeout=120)
        assert [(a.action, a.result) for a in out] == [("snapshot", "ok"), ("flush", "ok")], out
        snap, flush = out[0].detail, out[1].detail

        with open(snap["allocator_snapshot"], "rb") as f:
            data = pickle.load(f)
        assert data["segments"] and snap["segments"] == len(data["segments"])
        assert all("total_size" in s and "blocks" in s for s in data["segments"])

        assert flush["via"] == "probe"
        assert flush["released_bytes"] >= 2 * GIB
        assert flush["reserved_after"] < flush["reserved_before"]

        # NVML stops counting what empty_cache() gave back (the CUDA context stays).
        deadline = time.monotonic() + 20
        used_after = used_before
        while time.monotonic() < deadline:
            _, _, p = _tick(backend, pid)
            used_after = p.used_memory_bytes
            if used_before - used_after >= 0.9 * flush["released_bytes"]:
                break
            time.sleep(0.5)
        print(f"NVML used by pid {pid}: {used_before} -> {used_after} bytes; "
              f"probe released {flush['released_bytes']} bytes")
        assert used_before - used_after >= 0.9 * flush["released_bytes"]
    finally:
        backend.close()
