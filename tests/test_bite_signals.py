"""Memory signal edges an operator relies on, each one a small slip in the code would move:
a critical leak that slows to a crawl ends, transient spikes of growing size are not a leak,
and the gap between NVML and the allocator is never invented."""

from __future__ import annotations

from gpuwatch.model import GpuSample, ProbeSample, ProcessSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.fragmentation import FragmentationAnalyzer
from tests.test_leak import CRIT, GIB, MIB, feed, series


def test_a_critical_leak_that_slows_to_a_crawl_is_no_longer_critical():
    s = series()
    onset, slow = 60.0, 360.0

    def memory(el):
        fast = 64 * MIB * (min(el, slow) - onset) if el > onset else 0.0
        return 20 * GIB + fast + 1 * MIB * max(0.0, el - slow)  # then 1 MiB/s, far below

    changes = feed(s, memory, slow + 600, dt=2.0)
    assert changes[0][1] == 2 and onset < changes[0][0] <= onset + 60
    # the raw lower envelope's climb over the last 5 min falls under half the critical slope
    (t_exit, level), = changes[1:]
    assert level < 2
    assert slow + 300 <= t_exit <= slow + 300 + 60


def test_spikes_of_growing_size_over_a_flat_floor_are_not_a_critical_leak():
    # Every other sample is a transient that is handed back at once; the transients grow
    # by 100 MiB/s (faster than the critical slope), the memory kept does not grow.
    s = series()
    changes = feed(s, lambda el: 20 * GIB + (100 * MIB * el if int(el / 2) % 2 else 0.0),
                   600, dt=2.0)
    assert changes == []
    assert s.rate < CRIT / 2


def _unattributed(nvml_used, reserved):
    probe = ProbeSample(pid=7, t=1.0, create_time=1.0, reserved_bytes=reserved,
                        inactive_split_bytes=None if reserved is None else 0,
                        total_free_bytes=0)
    gpu = GpuSample(index=0, uuid="GPU-u", name="NVIDIA A100-SXM4-80GB",
                    memory_total_bytes=80 * GIB, memory_used_bytes=40 * GIB,
                    processes=[ProcessSample(pid=7, name="python3", create_time=1.0,
                                             used_memory_bytes=nvml_used)])
    derived = Derived()
    FragmentationAnalyzer().update(Tick(t=1.0, gpus=[gpu], probes=[probe]), derived,
                                   Conditions())
    return derived.process("GPU-u", 7).unattributed_bytes


def test_memory_outside_the_allocator_is_reported_only_when_both_figures_are_known():
    assert _unattributed(3 * GIB, 2 * GIB) == 1 * GIB
    assert _unattributed(None, 2 * GIB) is None  # NVML gives no per-process figure
    assert _unattributed(3 * GIB, None) is None  # the probe gives no reserved bytes
