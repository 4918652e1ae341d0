"""MIG mode, GPM, per-process utilization, NVLink, fabric and the recovery action on a real
GPU: each reads a real value or reports unsupported cleanly, at a measured cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from gpuwatch.sources.nvml import NvmlBackend

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

# bf16 GEMMs until killed: tensor cores busy most of the time.
GEMM = textwrap.dedent("""
    import sys, torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    print("ready", flush=True)
    while True:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
""")


def _evidence(name: str, data) -> None:
    out = os.environ.get("EVIDENCE_DIR")
    if out:
        with open(os.path.join(out, name), "w") as f:
            json.dump(data, f, indent=1, default=str)


@pytest.fixture
def backend():
    b = NvmlBackend(xid_events=False)
    b.open()
    yield b
    b.close()


def _timed_reads(backend, n: int) -> tuple[dict, dict[str, float]]:
    """The slow tier's reads n times; per-collector cost (µs, the mean after the first)."""
    dev = backend.devices[0]
    costs: dict[str, list[float]] = {}
    fields: dict = {}
    for _ in range(n):
        from gpuwatch.sources.gpu_depth.mig import read_mig

        t0 = time.perf_counter()
        read_mig(dev)
        costs.setdefault("mig", []).append(time.perf_counter() - t0)
        for c in dev.collectors:
            t0 = time.perf_counter()
            fields.update(c.read(dev))
            costs.setdefault(c.name, []).append(time.perf_counter() - t0)
        time.sleep(0.05)
    return fields, {k: round(1e6 * sum(v[1:]) / max(1, len(v) - 1), 1) for k, v in costs.items()}


def test_unsupported_fields_report_cleanly_and_cost_nothing_after(backend):
    slow = backend.sample_slow(0)
    dev = backend.devices[0]
    first = set(dev.unsupported)
    fields, costs = _timed_reads(backend, 20)
    assert set(dev.unsupported) == first  # nothing newly refused: decided on the first read
    mig = slow[dev.uuid].get("mig_mode")
    assert mig in (True, False, None)
    for key in ("nvlink_links_active", "recovery_action", "fabric_state"):
        # Either a real value or absent; never an error or a made-up zero.
        assert key not in fields or fields[key] is not None
    if "recovery_action" in fields:
        assert fields["recovery_action"] == 0  # a healthy GPU asks for nothing
    _evidence("gpu-depth-support.json", {"unsupported": sorted(dev.unsupported),
                                         "mig_mode": mig, "fields": fields,
                                         "cost_us_per_read": costs})
    if mig is False:
        # MIG off: the mode query is all it costs, on the slow tier only.
        assert costs["mig"] < 1000


def test_gpm_tensor_activity_and_process_utilization_under_bf16_gemms(backend):
    pytest.importorskip("torch")
    dev = backend.devices[0]
    backend.sample_slow(0)
    if "gpm" in dev.unsupported:
        pytest.skip("GPM not supported on this GPU")
    child = subprocess.Popen([sys.executable, "-c", GEMM], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().startswith("ready")
        time.sleep(2)
        backend.sample_slow(0)  # starts a GPM interval under load
        time.sleep(3)
        t0 = time.perf_counter()
        busy = backend.sample_slow(0)[dev.uuid]
        slow_cost = time.perf_counter() - t0
        utils = {u.pid: u for u in busy.get("process_utilization", [])}
    finally:
        child.kill()
        child.wait()
    time.sleep(2)
    backend.sample_slow(0)
    time.sleep(3)
    idle = backend.sample_slow(0)[dev.uuid]
    _evidence("gpu-depth-gpm.json", {
        "busy": {k: v for k, v in busy.items() if k.startswith("gpm_")},
        "idle": {k: v for k, v in idle.items() if k.startswith("gpm_")},
        "process_utilization": {str(p): [u.sm_ratio, u.memory_ratio] for p, u in utils.items()},
        "slow_tier_read_seconds": slow_cost})
    assert busy["gpm_tensor_active_ratio"] > 0.5
    assert busy["gpm_sm_active_ratio"] > 0.5
    assert idle["gpm_tensor_active_ratio"] < 0.05
    if "process_utilization" not in dev.unsupported:
        assert child.pid in utils and utils[child.pid].sm_ratio > 0.3
