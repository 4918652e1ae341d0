"""Zone and fragmentation edges through their public functions: exact thresholds, mixed
debounce, exit hysteresis, pool fractions, the critical (act) rule and its fall-back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuwatch.model import GpuSample, ProbeSample, ProcessSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.fragmentation import FragmentationAnalyzer, Limits, Measures, judge
from gpuwatch.signals.zone import ZoneState, pool_fraction

MIB = 1 << 20
WARN, CRIT, BAND = 100.0, 200.0, 10.0


def zone(values, enter=1, state=None):
    state = state or ZoneState()
    return [state.update(v, WARN, CRIT, BAND, enter) for v in values], state


def test_exact_thresholds_belong_to_the_lower_zone():
    assert zone([WARN])[0] == [0]
    assert zone([WARN + 1e-9])[0] == [1]
    assert zone([CRIT])[0] == [1]
    assert zone([CRIT + 1e-9])[0] == [2]


def test_mixed_critical_and_warning_samples_enter_the_lower_zone():
    levels, state = zone([CRIT + 1, WARN + 1, CRIT + 1], enter=3)
    assert levels == [0, 0, 1]
    # Then three critical samples in a row take it to critical, not fewer.
    levels, _ = zone([CRIT + 1, CRIT + 1, CRIT + 1], enter=3, state=state)
    assert levels == [1, 1, 2]
    # A sample back below resets the count.
    levels, _ = zone([CRIT + 1, CRIT + 1, 0.0, CRIT + 1, CRIT + 1], enter=3)
    assert levels == [0, 0, 0, 0, 0]


def test_exit_hysteresis_edges():
    _, state = zone([CRIT + 1])
    assert zone([CRIT - BAND + 1e-6], state=state)[0] == [2]  # inside the band: held
    assert zone([CRIT - BAND], state=state)[0] == [1]  # at the band's edge: out
    assert zone([WARN - BAND + 1e-6], state=state)[0] == [1]
    assert zone([WARN - BAND], state=state)[0] == [0]


def vllm(**cache):
    return SimpleNamespace(kind="vllm", cache_config=cache)


@pytest.mark.parametrize(("engine", "expected"), [
    (vllm(gpu_memory_utilization="0.85"), (0.85, "gpu_memory_utilization")),
    (vllm(gpu_memory_utilization="1"), (1.0, "gpu_memory_utilization")),
    # "90" is a percentage typed by mistake, not a pool of 90x the GPU: refused, and the
    # engine's default is used instead.
    (vllm(gpu_memory_utilization="90"), (0.9, "vLLM default gpu_memory_utilization")),
    (vllm(gpu_memory_utilization="0"), (0.9, "vLLM default gpu_memory_utilization")),
    (vllm(gpu_memory_utilization="nan"), (0.9, "vLLM default gpu_memory_utilization")),
    (vllm(), (0.9, "vLLM default gpu_memory_utilization")),
    (SimpleNamespace(kind="sglang", cache_config={"mem_fraction_static": "0.8"}),
     (0.8, "mem_fraction_static")),
    (SimpleNamespace(kind="sglang", cache_config={"mem_fraction_static": "80"}), None),
    (SimpleNamespace(kind="tgi", cache_config={}), None),
])
def test_pool_fraction(engine, expected):
    assert pool_fraction(engine, 0.9) == expected


# -- fragmentation ----------------------------------------------------------------------

def measures(ratio=0.5, free_mib=300, smallest_mib=100):
    return Measures(fragmentation_ratio=ratio, largest_free_share=0.9, free_blocks_per_mb=0.1,
                    total_free_bytes=int(free_mib * MIB),
                    smallest_free_block_bytes=int(smallest_mib * MIB))


def test_critical_rule_needs_little_free_memory_and_a_small_smallest_block():
    lim = Limits()
    assert judge(measures(), lim)[0] == 2
    assert judge(measures(smallest_mib=256), lim)[0] == 1  # 256 MiB is not < 256 MiB
    assert judge(measures(smallest_mib=255.9), lim)[0] == 2
    assert judge(measures(free_mib=512), lim)[0] == 1  # 512 MiB free is not < 512 MiB
    assert judge(measures(ratio=0.35), lim)[0] == 0  # exactly at the ratio's maximum
    assert judge(measures(ratio=0.3501), lim)[0] == 2
    m = measures()
    m.smallest_free_block_bytes = None  # unknown: never act on a guess
    assert judge(m, lim)[0] == 1


class FragRun:
    def __init__(self, n=3):
        self.analyzer = FragmentationAnalyzer(Limits(consecutive_samples=n))
        self.derived, self.conditions = Derived(), Conditions()
        self.t = 0.0
        self.level = 0
        self.events = []

    def sample(self, level: int):
        """One probe record at the given level (0 healthy, 1 risk, 2 act)."""
        self.t += 5.0
        ratio, free, smallest = {0: (0.1, 300, 100), 1: (0.5, 300, 300),
                                 2: (0.5, 300, 100)}[level]
        probe = ProbeSample(pid=7, t=self.t, create_time=1.0, reserved_bytes=1000 * MIB,
                            inactive_split_bytes=int(ratio * 1000 * MIB),
                            total_free_bytes=free * MIB, largest_free_block_bytes=free * MIB,
                            free_blocks=1, smallest_free_block_bytes=smallest * MIB)
        gpu = GpuSample(index=0, uuid="GPU-f", name="NVIDIA A100-SXM4-80GB",
                        memory_total_bytes=80 << 30, memory_used_bytes=40 << 30,
                        processes=[ProcessSample(pid=7, name="python3", create_time=1.0,
                                                 used_memory_bytes=2 << 30)])
        events = self.analyzer.update(Tick(t=self.t, gpus=[gpu], probes=[probe]), self.derived,
                                      self.conditions)
        self.events += events
        for ev in events:  # the level as the events tell it
            self.level = {"warning": 1, "critical": 2}[ev.severity] if (
                ev.state == "firing") else 0
        return self.level


def test_fragmentation_enters_after_n_samples_and_falls_back_after_n_below():
    run = FragRun()
    assert [run.sample(x) for x in (2, 2, 2)] == [0, 0, 2]
    # Two samples one level down do not move it; the third does, to that level.
    assert [run.sample(x) for x in (1, 1, 1)] == [2, 2, 1]
    assert [run.sample(x) for x in (0, 0, 0)] == [1, 1, 0]


def test_fragmentation_mixed_levels_enter_the_lower_one():
    run = FragRun()
    assert [run.sample(x) for x in (2, 1, 2)] == [0, 0, 1]
    assert [run.sample(x) for x in (2, 2)] == [1, 2]  # 1, 2, 2 -> min 1; 2, 2, 2 -> 2


def test_fragmentation_one_sample_below_does_not_resolve():
    run = FragRun()
    [run.sample(2) for _ in range(3)]
    assert [run.sample(x) for x in (0, 2, 0, 2)] == [2, 2, 2, 2]


def test_fragmentation_event_says_what_and_why():
    run = FragRun(n=1)
    run.sample(2)
    (ev,) = run.events
    assert (ev.state, ev.severity, ev.pid, ev.gpu_uuid) == ("firing", "critical", 7, "GPU-f")
    assert ev.value == 0.5 and ev.threshold == 0.35
    assert ev.message == (
        "pid 7: allocator fragmented (inactive_split/reserved 50% against its limit 35%): "
        "inactive_split/reserved 50%, "
        "largest free block 100% of 300 MiB free, 0.00 free blocks/MiB, as measured when this "
        "event fired (the current figures are in /api/state); little free memory "
        "left in small blocks: a cache flush is due")


def test_fragmentation_holds_its_level_through_a_window_straddling_it():
    run = FragRun()
    assert [run.sample(x) for x in (1, 1, 1)] == [0, 0, 1]
    # A healthy sample then two critical ones: the window (0, 2, 2) is neither all above
    # nor all below warning: the level holds.
    assert [run.sample(x) for x in (0, 2, 2)] == [1, 1, 1]
    assert run.sample(2) == 2


def test_free_blocks_per_mib_rule():
    lim = Limits()
    m = Measures(fragmentation_ratio=0.1, largest_free_share=0.9, free_blocks_per_mb=0.81,
                 total_free_bytes=100 * MIB, smallest_free_block_bytes=300 * MIB)
    assert judge(m, lim)[:2] == (1, "free blocks per MiB")
    m.free_blocks_per_mb = 0.8
    assert judge(m, lim)[0] == 0
    m.free_blocks_per_mb, m.total_free_bytes = 5.0, 64 * MIB - 1  # too little free to judge
    assert judge(m, lim)[0] == 0
