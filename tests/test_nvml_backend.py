"""The NVML backend against a fake driver raising each NVML error."""

from __future__ import annotations

import asyncio
import os

import pynvml
import pytest

from gpuwatch.exporter.snapshot import SourceStatus
from gpuwatch.sources.base import BackendUnavailable
from gpuwatch.sources.nvml import NvmlBackend
from tests.fake_nvml import GIB, FakeGpu, FakeNvml, err, proc


@pytest.fixture
def two_gpus(monkeypatch):
    gpus = [FakeGpu(0), FakeGpu(1, name="NVIDIA A100-SXM4-80GB", total=80 * GIB)]
    gpus[0].processes = [proc(os.getpid(), 2 * GIB), proc(999_999_99, None)]
    fake = FakeNvml(gpus)
    fake.install(monkeypatch)
    backend = NvmlBackend()
    backend.open()
    return fake, backend


def test_units_and_identity(two_gpus):
    _, backend = two_gpus
    s = backend.sample(1000.0)
    g = s[0]
    assert [x.uuid for x in s] == ["GPU-fake-0", "GPU-fake-1"]
    assert g.memory_used_bytes == 10 * GIB  # v2 used, without reserved
    assert g.memory_reserved_bytes == 512 * 1024**2
    assert g.utilization_ratio == pytest.approx(0.37)
    assert g.power_watts == pytest.approx(123.456)
    assert g.sm_clock_hz == 1980e6 and g.memory_clock_hz == 3201e6
    assert g.temperature_celsius == 51
    assert g.clocks_event_reasons == 0x4
    assert backend.driver_version == "580.159.03"


def test_settled_state_is_read_on_the_slow_tier_only(two_gpus):
    fake, backend = two_gpus
    backend.sample(0)
    asked = {k for (k, _), n in fake.calls.items() if n}
    # once a second each costs tens of microseconds in the driver; they change on events
    assert not asked & {"power_limit", "ecc", "remapped"}
    slow = backend.sample_slow(0)["GPU-fake-0"]
    assert slow["power_limit_watts"] == pytest.approx(700.0)
    assert slow["ecc_volatile_corrected_total"] == 3
    assert slow["ecc_volatile_uncorrected_total"] == 0
    assert slow["remapped_rows_correctable"] == 1 and slow["remapped_rows_pending"] is False


def test_processes_joined_with_host_and_unknown_memory(two_gpus):
    _, backend = two_gpus
    procs = {p.pid: p for p in backend.sample(0)[0].processes}
    me = procs[os.getpid()]
    assert me.used_memory_bytes == 2 * GIB
    assert me.name and me.create_time is not None  # psutil knows this process
    ghost = procs[999_999_99]
    assert ghost.used_memory_bytes is None  # NVML could not tell: absent, never 0
    assert ghost.name == "" and ghost.create_time is None


def test_not_supported_is_remembered_per_gpu_and_field(two_gpus):
    fake, backend = two_gpus
    fake.gpus[0].fail["power"] = err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    for _ in range(3):
        s = backend.sample(0)
    assert s[0].power_watts is None
    assert s[1].power_watts == pytest.approx(123.456)  # the other GPU still answers
    assert fake.calls[("power", 0)] == 1
    assert fake.calls[("power", 1)] == 3


def test_transient_error_is_asked_again(two_gpus):
    fake, backend = two_gpus
    fake.gpus[0].fail["utilization"] = err(pynvml.NVML_ERROR_UNKNOWN)
    assert backend.sample(0)[0].utilization_ratio is None
    del fake.gpus[0].fail["utilization"]
    assert backend.sample(0)[0].utilization_ratio == pytest.approx(0.37)


def test_lost_gpu_is_isolated(two_gpus):
    fake, backend = two_gpus
    fake.gpus[1].fail["utilization"] = err(pynvml.NVML_ERROR_GPU_IS_LOST)
    s = backend.sample(0)
    assert s[1].lost and not s[0].lost
    assert s[0].memory_used_bytes == 10 * GIB
    before = sum(n for (f, i), n in fake.calls.items() if i == 1)
    s = backend.sample(0)
    assert s[1].lost
    assert sum(n for (f, i), n in fake.calls.items() if i == 1) == before  # not queried again
    assert backend.sample_slow(0).keys() == {"GPU-fake-0"}


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
                                  pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                  pynvml.NVML_ERROR_NO_PERMISSION])
def test_init_failure_is_unavailable_with_reason(monkeypatch, code):
    FakeNvml([], init_error=err(code)).install(monkeypatch)
    with pytest.raises(BackendUnavailable) as info:
        NvmlBackend().open()
    assert str(err(code)) in str(info.value)


def test_library_mismatch_on_process_list_falls_back_to_v2(two_gpus, monkeypatch):
    fake, backend = two_gpus

    def mismatch(h):
        raise pynvml.NVMLLibraryMismatchError("unversioned function")

    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)
    # an older driver: no v3 entry point, and pynvml's unversioned wrapper needs it
    fake.missing_symbols.add("nvmlDeviceGetComputeRunningProcesses_v3")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", mismatch)
    fake.gpus[0].processes = [proc(4242, GIB)]

    def v2(h):
        fake.calls[("compute_v2", h.index)] += 1
        return list(h.processes)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses_v2", v2)
    assert [p.pid for p in backend.sample(0)[0].processes] == [4242]
    assert [p.pid for p in backend.sample(0)[0].processes] == [4242]
    assert fake.calls[("compute_v2", 0)] == 2


def test_each_process_list_is_one_driver_call(two_gpus):
    fake, backend = two_gpus
    backend.sample(0)
    before = fake.calls.copy()
    backend.sample(0)
    # compute, graphics and MPS: one call each (pynvml's wrappers ask the count first)
    assert fake.calls[("compute", 0)] - before[("compute", 0)] == 1


def test_process_list_buffer_grows_as_processes_come(two_gpus):
    fake, backend = two_gpus
    many = [proc(100_000 + i, (i + 1) * GIB if i % 7 else None) for i in range(50)]
    fake.gpus[0].processes = many
    before = fake.calls[("compute", 0)]
    got = {p.pid: p.used_memory_bytes for p in backend.sample(0)[0].processes}
    assert got == {p.pid: p.usedGpuMemory for p in many}  # none lost, unknown stays None
    assert fake.calls[("compute", 0)] - before == 2  # too small once, then large enough
    many.append(proc(99_999, GIB))  # room was left for more
    before = fake.calls[("compute", 0)]
    assert len(backend.sample(0)[0].processes) == 51
    assert fake.calls[("compute", 0)] - before == 1


def test_process_list_error_is_no_processes_this_tick(two_gpus):
    fake, backend = two_gpus
    fake.gpus[0].processes = [proc(4242, GIB)]
    fake.gpus[0].fail["compute"] = err(pynvml.NVML_ERROR_UNKNOWN)
    assert backend.sample(0)[0].processes == []
    del fake.gpus[0].fail["compute"]
    assert [p.pid for p in backend.sample(0)[0].processes] == [4242]


def test_lost_gpu_in_process_list_is_isolated(two_gpus):
    fake, backend = two_gpus
    fake.gpus[0].fail["compute"] = err(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert backend.sample(0)[0].lost


def test_empty_graphics_and_mps_lists_are_asked_again_after_a_while(monkeypatch):
    from gpuwatch.sources.process_lists import QUIET_RECHECK_SECONDS

    gpu = FakeGpu(0)
    fake = FakeNvml([gpu])
    fake.install(monkeypatch)
    now = [0.0]
    backend = NvmlBackend(xid_events=False, clock=lambda: now[0])
    backend.open()

    def tick(t):
        now[0] = t
        before = fake.calls.copy()
        pids = {p.pid: p for p in backend.sample(t)[0].processes}
        asked = {k for k in ("compute", "graphics", "mps")
                 if fake.calls[(k, 0)] > before[(k, 0)]}
        return pids, asked

    assert tick(0.0)[1] == {"compute", "graphics", "mps"}
    assert tick(1.0)[1] == {"compute"}  # the empty lists wait; compute is read every tick
    gpu.graphics_processes = [proc(4343, GIB)]  # a process with a graphics context only
    pids, asked = tick(QUIET_RECHECK_SECONDS - 1)
    assert 4343 not in pids and asked == {"compute"}
    pids, asked = tick(QUIET_RECHECK_SECONDS)
    assert pids[4343].type == "graphics" and asked == {"compute", "graphics", "mps"}
    pids, asked = tick(QUIET_RECHECK_SECONDS + 1)  # a list with processes: every tick
    assert 4343 in pids and asked == {"compute", "graphics"}
    gpu.graphics_processes = []
    assert tick(QUIET_RECHECK_SECONDS + 2)[1] == {"compute", "graphics"}
    assert tick(QUIET_RECHECK_SECONDS + 3)[1] == {"compute"}  # empty again: it waits


def test_pid_in_two_lists_keeps_first_kind_and_largest_figure(two_gpus):
    fake, backend = two_gpus
    fake.gpus[0].processes = [proc(4242, GIB)]
    fake.gpus[0].graphics_processes = [proc(4242, 3 * GIB), proc(4343, None)]
    procs = {p.pid: p for p in backend.sample(0)[0].processes}
    assert procs[4242].type == "compute" and procs[4242].used_memory_bytes == 3 * GIB
    assert procs[4343].type == "graphics" and procs[4343].used_memory_bytes is None


def test_mismatch_without_fallback_is_remembered(two_gpus, monkeypatch):
    _, backend = two_gpus
    calls = []

    def mismatch(h, *a):
        calls.append(1)
        raise pynvml.NVMLLibraryMismatchError("x")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", mismatch)
    backend.sample(0)
    backend.sample(0)
    assert backend.sample(0)[0].clocks_event_reasons is None
    assert len(calls) == 2  # once per GPU, then remembered


def test_memory_v1_fallback_when_v2_unsupported(two_gpus):
    fake, backend = two_gpus
    fake.gpus[0].fail["memory_v2"] = err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    g = backend.sample(0)[0]
    assert g.memory_used_bytes == 10 * GIB + 512 * 1024**2  # v1 used includes reserved
    assert g.memory_reserved_bytes is None
    assert backend.sample(0)[0].memory_total_bytes == 140 * GIB


def test_temperature_falls_back_when_v_symbol_missing(two_gpus):
    fake, backend = two_gpus
    fake.gpus[0].fail["temperature_v"] = err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    assert backend.sample(0)[0].temperature_celsius == 52


def test_xid_events_are_counted_without_blocking(two_gpus):
    fake, backend = two_gpus
    from types import SimpleNamespace

    fake.events = [SimpleNamespace(device=fake.gpus[1], eventData=79),
                   SimpleNamespace(device=fake.gpus[1], eventData=79),
                   SimpleNamespace(device=fake.gpus[0], eventData=13)]
    s = backend.sample(0)
    assert s[1].xid_events_total == {"79": 2} and s[1].last_xid == 79
    assert s[0].xid_events_total == {"13": 1}
    assert backend.sample(0)[1].xid_events_total == {"79": 2}  # cumulative, no new events


def test_slow_tier_units(two_gpus):
    _, backend = two_gpus
    slow = backend.sample_slow(0)["GPU-fake-0"]
    assert slow["energy_joules_total"] == 5000.0
    assert slow["pcie_tx_bytes_per_second"] == 1000 * 1024.0


def test_sampler_backs_off_and_recovers(monkeypatch):
    """A missing driver gives nvml down with the reason; the sampler retries with backoff."""
    from gpuwatch.sources.sampler import GpuSampler

    fake = FakeNvml([FakeGpu(0)], init_error=err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    fake.install(monkeypatch)
    status = SourceStatus()
    sampler = GpuSampler(NvmlBackend(), status, retry_max=60)

    async def go():
        assert await sampler.sample(0) == []
        assert not status.up and "Driver Not Loaded" in status.reason
        assert await sampler.sample(0) == []  # within the backoff: not even tried
        assert status.errors_total == 1
        fake.init_error = None
        sampler._retry_at = 0  # backoff elapsed
        gpus = await sampler.sample(0)
        assert status.up and status.reason == "" and len(gpus) == 1

    try:
        asyncio.run(go())
    finally:
        sampler.close()


def test_sampler_runs_the_follow_up_on_its_thread_after_a_good_sample_only(monkeypatch):
    """sample_then: what the daemon reads right after the GPUs (the probe directory) rides
    the same hand-off; what it raises comes back in its place; a failed sample runs none."""
    import threading

    from gpuwatch.sources.sampler import GpuSampler

    fake = FakeNvml([FakeGpu(0)])
    fake.install(monkeypatch)
    status = SourceStatus()
    sampler = GpuSampler(NvmlBackend(xid_events=False), status, retry_max=60)
    seen = []

    def then(gpus):
        seen.append((threading.current_thread() is threading.main_thread(), len(gpus)))
        return "read"

    def broken(gpus):
        raise OSError("probe directory unreadable")

    async def go():
        gpus, after = await sampler.sample_then(0, then)
        assert (len(gpus), after) == (1, "read") and seen == [(False, 1)]
        _, after = await sampler.sample_then(1, broken)
        assert isinstance(after, OSError) and status.up  # not the GPUs' failure
        fake.gpus[0].fail["utilization"] = RuntimeError("driver bug")
        gpus, after = await sampler.sample_then(2, then)
        assert (gpus, after) == ([], None) and len(seen) == 1

    try:
        asyncio.run(go())
    finally:
        sampler.close()


def test_the_sampling_thread_waits_for_the_loop_and_stops(monkeypatch):
    """start_ticks: samples on its own thread, each handed to the loop; the next one only
    after done() (a slow loop skips samples, never gets a burst); stop() ends the thread."""
    from gpuwatch.sources.sampler import GpuSampler

    FakeNvml([FakeGpu(0)]).install(monkeypatch)
    sampler = GpuSampler(NvmlBackend(xid_events=False), SourceStatus(), retry_max=60)
    got = []

    async def go():
        loop = asyncio.get_running_loop()
        ticks = sampler.start_ticks(loop, lambda: 0.02, lambda now: None, got.append)
        async def until(n):
            for _ in range(500):
                if len(got) >= n:
                    return
                await asyncio.sleep(0.01)
        await until(1)
        await asyncio.sleep(0.3)  # 15 intervals
        held = len(got)  # the loop never said it was done with the first
        ticks.done()
        await until(2)
        ticks.done()
        await until(3)
        await asyncio.sleep(0.1)
        ticks.stop()
        ticks.done()
        ticks.thread.join(2)
        return held, ticks.thread.is_alive()

    try:
        held, alive = asyncio.run(go())
    finally:
        sampler.close()
    assert held == 1 and not alive
    assert len(got) == 3  # one more per done()
    gpus, _ = sampler.take(got[0])
    assert [g.uuid for g in gpus] == ["GPU-fake-0"] and sampler.status.up


def test_slow_tier_reads_as_soon_as_the_backend_opens(two_gpus):
    """Its fields (the power limit, ECC) are absent until its first read: that read comes as
    soon as the backend is open, not one slow interval later."""
    from gpuwatch.sources.sampler import GpuSampler

    _, backend = two_gpus
    sampler = GpuSampler(backend, SourceStatus(), 60.0)

    async def go():
        task = asyncio.create_task(sampler.slow_loop(3600.0, SourceStatus()))
        await sampler.sample(0.0)  # the fast tier opens the backend
        for _ in range(300):
            await asyncio.sleep(0.01)
            gpus = await sampler.sample(1.0)
            if gpus[0].power_limit_watts is not None:
                break
        task.cancel()
        return gpus

    try:
        gpus = asyncio.run(go())
    finally:
        sampler.close()
    assert gpus[0].power_limit_watts == pytest.approx(700.0)
    assert gpus[0].ecc_volatile_corrected_total == 3
