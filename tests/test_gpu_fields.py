"""Fans, HBM temperature, P-state, media engines (NVML backend against the fake driver with the
real API's shapes and return codes), and the host side of GPU processes (psutil, real
processes): read on their tiers, absent where unsupported, asked once when unsupported."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pynvml
import pytest

from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import Tick
from gpuwatch.sources.processes import MAX_PIDFDS, ProcessInfo
from tests.fake_nvml import FakeGpu, open_backend, proc

MEMORY_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP


def h200() -> FakeGpu:
    """What an H200 answered: no fans, HBM at 34 C, P0, media engines idle, OFA missing here."""
    gpu = FakeGpu(0)
    gpu.field_values[MEMORY_TEMP] = 34
    gpu.media = {"encoder": 0, "decoder": 0, "jpg": 0}
    return gpu


def test_h200_fields_on_the_fast_tier_unsupported_ones_absent_and_asked_once(monkeypatch):
    fake, backend = open_backend(monkeypatch, [h200()])
    for t in range(5):
        (g,) = backend.sample(t)
    assert g.memory_temperature_celsius == 34.0
    assert g.performance_state == 0
    assert (g.encoder_utilization_ratio, g.decoder_utilization_ratio,
            g.jpeg_utilization_ratio) == (0.0, 0.0, 0.0)
    assert g.fan_speed_ratio is None and g.ofa_utilization_ratio is None  # absent, not 0
    assert fake.calls[("fan", 0)] == 1 and fake.calls[("ofa", 0)] == 1
    assert fake.calls[("pstate", 0)] == 5
    # the slowdown threshold: slow tier, read once
    for t in range(3):
        slow = backend.sample_slow(t)["GPU-fake-0"]
    assert slow["memory_temperature_max_celsius"] == 95.0
    assert fake.calls[(f"threshold_{pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX}", 0)] == 1


def test_a_board_with_fans_and_no_memory_sensor(monkeypatch):
    gpu = FakeGpu(0, name="NVIDIA GeForce RTX 4090")
    gpu.fan_speed, gpu.pstate, gpu.memory_temp_max = 55, 8, None
    gpu.media = {"encoder": 12, "decoder": 40, "jpg": 0, "ofa": 3}
    fake, backend = open_backend(monkeypatch, [gpu])
    for t in range(3):
        (g,) = backend.sample(t)
    assert g.fan_speed_ratio == 0.55 and g.performance_state == 8
    assert (g.encoder_utilization_ratio, g.decoder_utilization_ratio,
            g.ofa_utilization_ratio) == (0.12, 0.4, 0.03)
    assert g.memory_temperature_celsius is None  # the field answered NotSupported
    assert fake.calls[("field_values", 0)] == 1
    assert "memory_temperature_max_celsius" not in backend.sample_slow(0)["GPU-fake-0"]


def test_pstate_unknown_is_absent(monkeypatch):
    gpu = h200()
    gpu.pstate = pynvml.NVML_PSTATE_UNKNOWN
    _, backend = open_backend(monkeypatch, [gpu])
    (g,) = backend.sample(0)
    assert g.performance_state is None


def test_the_new_series_are_exported_only_where_read(monkeypatch):
    rtx = FakeGpu(1, name="NVIDIA GeForce RTX 4090")
    rtx.fan_speed = 70
    _, backend = open_backend(monkeypatch, [h200(), rtx])
    tick = Tick(t=1.0, gpus=backend.sample(1.0))
    text = Renderer().render(Snapshot(tick=tick, version=1)).decode()
    lines = text.splitlines()
    assert 'gpuwatch_gpu_memory_temperature_celsius{gpu="0",uuid="GPU-fake-0"} 34.0' in lines
    assert not any(x.startswith('gpuwatch_gpu_memory_temperature_celsius{gpu="1"')
                   for x in lines)
    assert 'gpuwatch_gpu_fan_speed_ratio{gpu="1",uuid="GPU-fake-1"} 0.7' in lines
    assert not any(x.startswith('gpuwatch_gpu_fan_speed_ratio{gpu="0"') for x in lines)
    assert ('gpuwatch_gpu_media_engine_utilization_ratio{engine="decoder",gpu="0",'
            'uuid="GPU-fake-0"} 0.0') in lines
    assert not any('engine="ofa",gpu="0"' in x for x in lines)
    assert 'gpuwatch_gpu_performance_state{gpu="0",uuid="GPU-fake-0"} 0.0' in lines


def test_gpu_processes_carry_their_host_cpu_and_resident_memory(monkeypatch):
    """A real busy child and a real idle one, seen through NVML's pid lists."""
    busy = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE, text=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); "
                             "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline() == idle.stdout.readline() == "ready\n"  # started
        gpu = h200()
        gpu.processes = [proc(busy.pid, 1 << 30), proc(idle.pid, 1 << 30), proc(999999, 1)]
        _, backend = open_backend(monkeypatch, [gpu])
        backend._procinfo = ProcessInfo(host_refresh=0.5)
        first = {p.pid: p for p in backend.sample(0)[0].processes}
        time.sleep(2.0)
        later = {p.pid: p for p in backend.sample(1)[0].processes}
    finally:
        busy.kill()
        idle.kill()
    assert first[busy.pid].cpu_ratio is None  # one reading: no share yet
    b, i = later[busy.pid], later[idle.pid]
    # a busy core against a sleeping process (the share itself depends on how loaded the host is)
    assert b.cpu_ratio > 0.02 and b.cpu_ratio > 5 * (i.cpu_ratio or 0.001)
    assert b.cpu_seconds_total >= first[busy.pid].cpu_seconds_total
    assert 1 << 20 < b.resident_memory_bytes < 1 << 30
    gone = later[999999]  # no such process on this host: nothing invented
    assert (gone.cpu_seconds_total, gone.cpu_ratio, gone.resident_memory_bytes) == (
        None, None, None)


def test_host_figures_are_read_again_only_after_the_refresh(monkeypatch):
    now = [100.0]
    info = ProcessInfo(clock=lambda: now[0], host_refresh=5.0)
    reads = []
    real = ProcessInfo._host_figures

    def counting(self, pid, p, create_time):
        before = self._host.get(pid)
        out = real(self, pid, p, create_time)
        reads.append(out is not before)
        return out
    monkeypatch.setattr(ProcessInfo, "_host_figures", counting)
    for dt in (0, 1, 2, 4, 5, 6, 10):
        now[0] = 100.0 + dt
        info.describe(os.getpid(), None, "compute")
    assert reads == [True, False, False, False, True, False, True]


@pytest.mark.parametrize("pidfds", [MAX_PIDFDS, 0], ids=["pidfd", "start-time"])
def test_a_process_is_looked_up_once_and_a_reused_pid_again(monkeypatch, pidfds):
    import psutil

    from gpuwatch.sources import processes

    made, stats = [], []
    real, real_ticks = psutil.Process, processes._start_ticks
    monkeypatch.setattr(processes.psutil, "Process", lambda pid: made.append(pid) or real(pid))
    monkeypatch.setattr(processes, "_start_ticks", lambda pid: stats.append(pid) or real_ticks(pid))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    info = ProcessInfo(host_refresh=3600, max_pidfds=pidfds)
    try:
        first = info.describe(child.pid, 1, "compute")
        for k in range(6):
            if k % 2:
                info.poll_exits()  # as a sample does: one poll for all, or one each
            assert info.describe(child.pid, 1, "compute").name == first.name != ""
        assert made == [child.pid]  # one lookup
        # later samples: one poll of the pidfd, or one read of the start time, each
        assert len(stats) == (1 if pidfds else 7)
        if not pidfds:  # the pid now names a process started at another time: afresh
            old = info._known[child.pid]
            info._known[child.pid] = old._replace(ticks=old.ticks - 1, name="someone-else")
            again = info.describe(child.pid, 1, "compute")
            assert again.name == first.name != "someone-else" and len(made) == 2
    finally:
        child.kill()
        child.wait()
    info.poll_exits()
    gone = info.describe(child.pid, 1, "compute")  # exited (and reaped): nothing kept
    assert (gone.name, gone.create_time, gone.cpu_seconds_total) == ("", None, None)
    info.close()
