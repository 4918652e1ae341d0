"""The real NVML path on a real GPU (skipped without one)."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import wait_until

pytestmark = pytest.mark.gpu

GIB = 1024**3


def _smi(query: str) -> list[list[str]]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not installed")
    out = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(out))]


def test_backend_agrees_with_nvidia_smi():
    from gpuwatch.sources.nvml import NvmlBackend

    backend = NvmlBackend()
    backend.open()
    try:
        gpus = backend.sample(0)
        slow = backend.sample_slow(0)  # the enforced power limit is on the slow tier
        rows = _smi("index,uuid,name,memory.total,pci.bus_id,driver_version,power.limit")
        assert len(gpus) == len(rows)
        for g, row in zip(gpus, rows, strict=True):
            index, uuid, name, total_mib, bus, driver, limit = row
            assert g.index == int(index) and g.uuid == uuid and g.name == name
            assert g.memory_total_bytes == int(total_mib) * 1024**2
            assert g.pci_bus_id.lower().endswith(bus.lower()[-12:])
            assert backend.driver_version == driver
            if limit not in ("[N/A]", "N/A"):
                assert slow[g.uuid]["power_limit_watts"] == pytest.approx(float(limit), abs=1)
            assert 0 <= g.utilization_ratio <= 1
            assert 0 < g.temperature_celsius < 120
            assert g.power_watts > 0 and g.sm_clock_hz > 0
        # memory.used moves: compare within a tolerance taken at the same moment
        used = _smi("memory.used")
        for g, (mib,) in zip(backend.sample(0), used, strict=True):
            assert abs(g.memory_used_bytes + (g.memory_reserved_bytes or 0)
                       - int(mib) * 1024**2) <= 64 * 1024**2 or abs(
                g.memory_used_bytes - int(mib) * 1024**2) <= 64 * 1024**2
    finally:
        backend.close()


ALLOCATOR = textwrap.dedent("""
    import os, sys, time, torch
    x = torch.empty(8 * 1024**3, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    print("allocated", os.getpid(), flush=True)
    time.sleep(float(sys.argv[1]))
""")


def test_torch_process_8gib_appears_with_pid(daemon, tmp_path):
    pytest.importorskip("torch")
    child = subprocess.Popen([sys.executable, "-c", ALLOCATOR, "60"],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("allocated"), line
        d = daemon("--record", str(tmp_path / "gpu-run.jsonl"),
                   env={"GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "1"})
        pattern = re.compile(
            r'^gpuwatch_process_gpu_memory_used_bytes\{[^}]*pid="' + str(child.pid)
            + r'"[^}]*\} (\S+)$', re.M)

        def seen():
            m = pattern.search(d.metrics())
            return m and float(m.group(1))

        used = wait_until(seen, 20, what="the torch process in /metrics")
        assert used >= 8 * GIB
        body = d.metrics()
        out_dir = os.environ.get("EVIDENCE_DIR")
        if out_dir:  # keep the run's output as evidence
            with open(os.path.join(out_dir, "gpu-metrics.prom"), "w") as f:
                f.write(body)
        state = d.state()
        procs = [p for g in state["sample"]["gpus"] for p in g["processes"]
                 if p["pid"] == child.pid]
        assert procs and procs[0]["name"].startswith("python")
        assert procs[0]["create_time"] is not None
    finally:
        child.kill()
        child.wait()


def test_exited_process_series_disappear(daemon):
    pytest.importorskip("torch")
    child = subprocess.Popen([sys.executable, "-c", ALLOCATOR, "600"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().startswith("allocated")
        d = daemon(env={"GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "1"})
        wait_until(lambda: f'pid="{child.pid}"' in d.metrics(), 20, what="process present")
    finally:
        child.kill()
        child.wait()
    wait_until(lambda: f'pid="{child.pid}"' not in d.metrics(), 20, what="process gone")
