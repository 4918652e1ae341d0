"""MIG, GPM, NVLink, fabric, recovery action, per-process utilization and XIDs through the
NVML backend against a fake driver with the real API's shapes and return codes."""

from __future__ import annotations

import os
import re
from types import SimpleNamespace

import pynvml
import pytest

from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import Tick
from gpuwatch.sources.gpu_depth.fabric import judge
from gpuwatch.thresholds import load_table
from gpuwatch.xid import describe
from tests.fake_nvml import GIB, FakeGpu, FakeMig, err, open_backend, proc

MIB = 1 << 20


def test_mig_disabled_is_read_on_the_slow_tier_only(monkeypatch):
    gpu = FakeGpu(0)
    gpu.mig_slots = []  # MIG-capable, off (as an H200 ships)
    fake, backend = open_backend(monkeypatch, [gpu])
    for t in range(5):
        backend.sample(t)
    assert fake.calls[("mig_mode", 0)] == 0  # never on the fast tier
    slow = backend.sample_slow(0)["GPU-fake-0"]
    assert slow["mig_mode"] is False
    assert fake.calls[("mig_mode", 0)] == 1


def test_mig_instances_are_sampled_as_gpus_with_their_processes(monkeypatch):
    gpu = FakeGpu(0, name="NVIDIA A100-SXM4-80GB", total=80 * GIB)
    small = FakeMig(gpu, 1, 0, "1g.10gb", 10 * GIB)
    big = FakeMig(gpu, 2, 0, "3g.40gb", 40 * GIB)
    small.used, big.used = 2 * GIB, 30 * GIB
    small.processes = [proc(os.getpid(), None)]  # MIG hides per-process memory here
    big.processes = [proc(4242, 29 * GIB)]
    gpu.processes = [proc(os.getpid(), None), proc(4242, None)]
    gpu.mig_slots, gpu.mig_enabled = [small, None, big, None], True  # empty slots: NOT_FOUND
    _, backend = open_backend(monkeypatch, [gpu])
    backend.sample_slow(0)
    out = backend.sample(1)
    assert [g.uuid for g in out] == ["GPU-fake-0", "MIG-fake-0-1-0", "MIG-fake-0-2-0"]
    parent, s, b = out
    assert parent.processes == []  # the instances own them: never counted twice
    assert (s.mig_parent_uuid, s.mig_instance, s.mig_profile) == ("GPU-fake-0", "gi1/ci0",
                                                                   "1g.10gb")
    assert s.memory_total_bytes == 10 * GIB and s.memory_used_bytes == 2 * GIB
    assert [p.used_memory_bytes for p in s.processes] == [None]  # absent, never invented
    assert [(p.pid, p.used_memory_bytes) for p in b.processes] == [(4242, 29 * GIB)]
    # Each instance is judged on a row derived from its own memory, marked derived.
    table = load_table()
    row = table.match(b.name, b.memory_total_bytes)
    assert not row.calibrated and row.rule.startswith("MIG instance")
    assert row.critical_bytes < 40 * GIB


def test_mig_instance_memory_feeds_zone_and_leak_per_instance(monkeypatch):
    from gpuwatch.config import load
    from gpuwatch.signals.pipeline import Pipeline

    gpu = FakeGpu(0, name="NVIDIA A100-SXM4-80GB", total=80 * GIB)
    inst = FakeMig(gpu, 1, 0, "1g.10gb", 10 * GIB)
    gpu.mig_slots, gpu.mig_enabled = [inst], True
    _, backend = open_backend(monkeypatch, [gpu])
    backend.sample_slow(0)
    pipe = Pipeline.from_config(load(None))
    inst.used = int(9.8 * GIB)  # nearly full instance, while the parent has room
    events = []
    for t in range(0, 120, 2):
        events += pipe.update(Tick(t=float(t), gpus=backend.sample(t)))
    zone = [e for e in events if e.signal == "memory_zone" and e.state == "firing"]
    assert zone and {e.gpu_uuid for e in zone} == {"MIG-fake-0-1-0"}


def test_gpm_reads_between_two_samples_and_stops_when_unsupported(monkeypatch):
    a, b = FakeGpu(0), FakeGpu(1)
    a.gpm_supported = True
    a.gpm_values = {pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 73.0,
                    pynvml.NVML_GPM_METRIC_SM_UTIL: 91.0,
                    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 40.0,
                    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 2.0}
    fake, backend = open_backend(monkeypatch, [a, b])
    first = backend.sample_slow(0)
    assert "gpm_tensor_active_ratio" not in first["GPU-fake-0"]  # first read starts interval
    second = backend.sample_slow(30)["GPU-fake-0"]
    assert second["gpm_tensor_active_ratio"] == pytest.approx(0.73)
    assert second["gpm_sm_active_ratio"] == pytest.approx(0.91)
    assert second["gpm_pcie_tx_bytes_per_second"] == pytest.approx(2 * MIB)
    assert "gpm_nvlink_tx_bytes_per_second" not in second  # unsupported metric: absent
    backend.sample_slow(60)
    assert fake.calls[("gpm_support", 1)] == 1 and fake.calls[("gpm_sample", 1)] == 0


def test_nvlink_fabric_recovery_read_or_cost_nothing_after_not_supported(monkeypatch):
    a, b = FakeGpu(0), FakeGpu(1)
    a.nvlink_states = [1] * 18 + [0] * 18
    a.field_values = {pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 7,
                      pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: 2,
                      pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: 0,
                      pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 1}
    a.fabric = (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS, 0)
    fake, backend = open_backend(monkeypatch, [a, b])
    for t in range(3):
        slow = backend.sample_slow(t)
    got = slow["GPU-fake-0"]
    assert got["nvlink_links_active"] == 18
    assert got["nvlink_errors_total"] == {"crc": 7, "replay": 2, "recovery": 0}
    assert got["recovery_action"] == 1
    assert got["fabric_state"] == "completed" and got["fabric_healthy"] is True
    other = slow["GPU-fake-1"]  # single GPU, no fabric: nothing reported, nothing invented
    for key in ("nvlink_links_active", "nvlink_errors_total", "recovery_action",
                "fabric_state", "fabric_healthy"):
        assert key not in other
    assert fake.calls[("nvlink_state", 1)] == 1
    assert fake.calls[("fabric", 1)] == 1


def test_fabric_health_judgement():
    done = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    degraded = (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE
                << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW)
    assert judge(done, pynvml.NVML_SUCCESS, 0) == ("completed", True)
    assert judge(done, pynvml.NVML_SUCCESS, degraded) == ("completed", False)
    assert judge(done, pynvml.NVML_ERROR_UNKNOWN, 0) == ("completed", False)
    assert judge(pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, 0, 0) == ("in_progress", None)


def test_process_utilization_newest_sample_per_pid_and_idle(monkeypatch):
    gpu = FakeGpu(0)
    gpu.processes = [proc(os.getpid(), GIB)]
    gpu.process_util = [
        SimpleNamespace(pid=os.getpid(), timeStamp=100, smUtil=20, memUtil=5, encUtil=0,
                        decUtil=0),
        SimpleNamespace(pid=os.getpid(), timeStamp=200, smUtil=60, memUtil=30, encUtil=0,
                        decUtil=10),
    ]
    _, backend = open_backend(monkeypatch, [gpu])
    first = backend.sample_slow(0)["GPU-fake-0"]["process_utilization"]
    assert [(u.pid, u.sm_ratio, u.decoder_ratio) for u in first] == [(os.getpid(), 0.6, 0.1)]
    idle = backend.sample_slow(1)["GPU-fake-0"]["process_utilization"]
    assert idle == []  # NVML_ERROR_NOT_FOUND: nothing ran since, not an error


def test_xid_table_names_the_action():
    assert describe(79).action == "reboot_node"
    assert describe(48).action == "reset_gpu"
    assert describe(13).action == "restart_app"
    assert describe(99999).action == "investigate"


def test_new_series_render_and_pass_promtool_lint(monkeypatch, tmp_path):
    import shutil
    import subprocess

    gpu = FakeGpu(0)
    gpu.processes = [proc(os.getpid(), GIB)]
    gpu.gpm_supported = True
    gpu.gpm_values = {pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 55.0}
    gpu.field_values = {pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0}
    gpu.process_util = [SimpleNamespace(pid=os.getpid(), timeStamp=1, smUtil=42, memUtil=1,
                                        encUtil=0, decUtil=0)]
    migged = FakeGpu(1)
    inst = FakeMig(migged, 1, 0, "1g.18gb", 18 * GIB)
    migged.mig_slots, migged.mig_enabled = [inst], True
    _, backend = open_backend(monkeypatch, [gpu, migged])
    backend.sample_slow(0)
    gpu.process_util.append(SimpleNamespace(pid=os.getpid(), timeStamp=2, smUtil=42, memUtil=1,
                                            encUtil=0, decUtil=0))
    slow = backend.sample_slow(30)
    gpus = backend.sample(31)
    for g in gpus:
        for k, v in slow.get(g.uuid, {}).items():
            setattr(g, k, v)
    gpus[0].xid_events_total = {"79": 1}
    snap = Snapshot(tick=Tick(t=31.0, gpus=gpus))
    text = Renderer().render(snap).decode()
    assert 'gpuwatch_gpu_tensor_active_ratio{gpu="0",uuid="GPU-fake-0"} 0.55' in text
    assert ('gpuwatch_gpu_mig_info{gpu="1",mig_instance="gi1/ci0",mig_profile="1g.18gb",'
            'parent_uuid="GPU-fake-1",uuid="MIG-fake-1-1-0"} 1.0') in text
    assert 'gpuwatch_gpu_recovery_action{gpu="0",uuid="GPU-fake-0"} 0.0' in text
    assert 'action="reboot_node",gpu="0",uuid="GPU-fake-0",xid="79"' in text
    assert re.search(r'gpuwatch_process_utilization_ratio\{(?=[^}]*engine="sm")'
                     r'(?=[^}]*pid="' + str(os.getpid()) + r'")[^}]*\} 0\.42', text)
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_lost_mig_instance_isolates_its_parent(monkeypatch):
    gpu = FakeGpu(0)
    inst = FakeMig(gpu, 1, 0, "1g.18gb", 18 * GIB)
    gpu.mig_slots, gpu.mig_enabled = [inst], True
    _, backend = open_backend(monkeypatch, [gpu])
    backend.sample_slow(0)
    inst.fail["memory_v2"] = err(pynvml.NVML_ERROR_GPU_IS_LOST)
    out = backend.sample(1)
    assert out[1].lost
    assert backend.sample(2)[0].lost
