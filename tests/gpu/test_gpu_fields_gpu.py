"""Fans, HBM temperature, P-state, media engines and the GPU processes' host side on a real GPU,
checked against nvidia-smi and ps (skipped without a GPU; about 20 s).

nvidia-smi answers "[N/A]" (or "N/A", "[Not Supported]") for what the board lacks; gpuwatch must
then have the field absent, never 0. A query field this nvidia-smi does not know is skipped.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.gpu

NA = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "")


def _smi_field(field: str) -> list[str] | None:
    """One --query-gpu field for every GPU, or None when this nvidia-smi lacks the field."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not installed")
    res = subprocess.run([smi, f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30)
    if res.returncode != 0 or "not a valid field" in (res.stdout + res.stderr).lower():
        return None
    return [line.strip() for line in res.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def backend():
    from gpuwatch.sources.nvml import NvmlBackend

    b = NvmlBackend(xid_events=False)
    b.open()
    yield b
    b.close()


def _number(text: str) -> float | None:
    return None if text in NA else float(text.rstrip(" %CW").strip())


def test_fields_agree_with_nvidia_smi_and_are_absent_where_it_says_na(backend):
    gpus = [g for g in backend.sample(time.time()) if not g.mig_parent_uuid]
    checked = 0
    for field, attr, scale, tolerance in (
        ("temperature.memory", "memory_temperature_celsius", 1.0, 6.0),
        ("fan.speed", "fan_speed_ratio", 100.0, 10.0),
        ("utilization.encoder", "encoder_utilization_ratio", 100.0, 30.0),
        ("utilization.decoder", "decoder_utilization_ratio", 100.0, 30.0),
        ("utilization.jpeg", "jpeg_utilization_ratio", 100.0, 30.0),
        ("utilization.ofa", "ofa_utilization_ratio", 100.0, 30.0),
    ):
        rows = _smi_field(field)
        if rows is None:
            continue
        assert len(rows) == len(gpus), (field, rows)
        for g, text in zip(gpus, rows, strict=True):
            mine = getattr(g, attr)
            theirs = _number(text)
            if theirs is None:
                assert mine is None, f"GPU {g.index} {field}: nvidia-smi {text!r}, ours {mine}"
            else:
                assert mine is not None, f"GPU {g.index} {field}: nvidia-smi {text}, ours absent"
                assert mine * scale == pytest.approx(theirs, abs=tolerance), (field, g.index)
            checked += 1
    assert checked, "nvidia-smi answered none of the fields"
    pstates = _smi_field("pstate")
    if pstates is not None:
        for g, text in zip(gpus, pstates, strict=True):
            if text in NA:
                assert g.performance_state is None
            else:
                # the state can move between the two reads: within two steps
                assert abs(g.performance_state - int(text.lstrip("P"))) <= 2, (g.index, text)
    slow = backend.sample_slow(time.time())
    for g in gpus:
        limit = slow.get(g.uuid, {}).get("memory_temperature_max_celsius")
        if g.memory_temperature_celsius is not None and limit is not None:
            assert 60 <= limit <= 130 and limit > g.memory_temperature_celsius


HOLDER = textwrap.dedent("""
    import sys, time, torch
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda"); x.fill_(1)
    host = bytearray(512 * 1024**2)  # resident host memory that shows in RSS
    torch.cuda.synchronize()
    print("ready", flush=True)
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        pass  # a busy core
""")


def test_a_torch_process_host_cpu_and_rss_as_ps_reads_them(backend):
    pytest.importorskip("torch")
    import psutil

    child = subprocess.Popen([sys.executable, "-c", HOLDER, "25"], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().startswith("ready")
        from gpuwatch.sources.processes import ProcessInfo

        backend._procinfo = ProcessInfo(host_refresh=1.0)
        ours = None
        deadline = time.time() + 15
        while time.time() < deadline:
            found = [p for g in backend.sample(time.time()) for p in g.processes
                     if p.pid == child.pid]
            if found and found[0].cpu_ratio is not None:
                ours = found[0]
                break
            time.sleep(1.2)
        assert ours is not None, "the torch process never showed with a CPU share"
        ps = psutil.Process(child.pid)
        rss = ps.memory_info().rss
        assert ours.resident_memory_bytes == pytest.approx(rss, rel=0.25)
        assert ours.resident_memory_bytes > 512 * 1024**2
        assert 0.3 <= ours.cpu_ratio <= 1.5  # one busy Python thread
        cpu = ps.cpu_times()
        assert ours.cpu_seconds_total <= cpu.user + cpu.system + 0.1
    finally:
        child.kill()
        child.wait(10)
