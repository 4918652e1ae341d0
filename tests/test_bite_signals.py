"""Memory signal edges an operator relies on, each one a small slip in the code would move:
leak episodes that crawl, pause or only spike; zone, time-to-OOM and fragmentation limits
and their exit bands; which probe record is believed; when gone processes and GPUs are
forgotten; and the units and rules an event states. Nothing is invented where a figure is
missing."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from gpuwatch.config import load
from gpuwatch.events import Event
from gpuwatch.model import GpuSample, ProbeSample, ProcessSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.config import LeakConfig, TimeToOomConfig
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.fragmentation import (
    FragmentationAnalyzer,
    Limits,
    Measures,
    judge,
    locate,
    measure,
)
from gpuwatch.signals.memory import MemoryAnalyzer
from gpuwatch.signals.oom import HorizonState, time_to_oom
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.signals.zone import planned_bytes, pool_fraction
from gpuwatch.thresholds import load_table
from tests.test_bite_zone_frag import FragRun
from tests.test_leak import CRIT, GIB, MIB, T0, WARN, feed, gpu_tick, saw, series
from tests.test_leak import run as run_ticks
from tests.test_oom import BUDGET as OOM_BUDGET
from tests.test_oom import run_leak
from tests.test_zone import gpu as zone_gpu
from tests.test_zone import zone_run


@pytest.mark.xfail(strict=True, reason=(
    "known miss: the critical episode ends at 676 s and the 1 MiB/s that goes on (5 x the "
    "warning slope) fires a new warning at 960 s, where it should fall back to a warning"))
def test_a_critical_leak_that_slows_to_a_crawl_is_no_longer_critical():
    s = series()
    onset, slow = 60.0, 360.0

    def memory(el):
        fast = 64 * MIB * (min(el, slow) - onset) if el > onset else 0.0
        return 20 * GIB + fast + 1 * MIB * max(0.0, el - slow)  # then 1 MiB/s, far below

    changes = feed(s, memory, slow + 600, dt=2.0)
    assert changes[0][1] == 2 and onset < changes[0][0] <= onset + 60
    # the raw lower envelope's climb over the exit window falls under half the critical
    # slope once that window lies after the fast climb
    c = LeakConfig()
    t_exit, level = changes[1]
    # it falls back to a warning: the leak goes on at 5 x the warning slope
    assert level == 1
    assert slow + c.critical_resolve_seconds <= t_exit
    assert t_exit <= slow + c.critical_resolve_seconds + c.critical_window_seconds + 20


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


@pytest.mark.parametrize("fraction", ["1.5", "2", "-0.5"])
def test_a_pool_fraction_outside_zero_to_one_is_not_believed(fraction):
    engine = SimpleNamespace(kind="vllm", cache_config={"gpu_memory_utilization": fraction})
    assert pool_fraction(engine, 0.9) == (0.9, "vLLM default gpu_memory_utilization")


@pytest.mark.parametrize("total", [0, None])
def test_a_gpu_of_unknown_size_plans_no_pool(total):
    # Without the GPU's total memory no pool can be worked out: nothing is planned, and
    # no note claims a pool.
    gpu = GpuSample(index=0, uuid="GPU-z", name="NVIDIA A100-SXM4-80GB",
                    memory_total_bytes=total, memory_used_bytes=70 * GIB,
                    processes=[ProcessSample(pid=7, used_memory_bytes=60 * GIB)])
    engines = {"vllm-0": SimpleNamespace(kind="vllm", pids=[7], cache_config={})}
    assert planned_bytes(gpu, engines, 0.9) == (0.0, [])
    gpu.memory_total_bytes = 80 * GIB
    assert planned_bytes(gpu, engines, 0.9) == (60 * GIB, [
        "zone: vllm-0 pre-allocates 0.9 of total (vLLM default gpu_memory_utilization): "
        "60.0 GiB planned"])


def test_memory_growing_by_less_than_a_byte_a_second_still_has_a_time_to_oom():
    assert time_to_oom(1000.0, 0.5) == 2000.0


def test_time_to_oom_exactly_at_a_horizon_or_its_exit_belongs_to_the_lower_level():
    cfg = TimeToOomConfig(critical_seconds=1800.0, warning_seconds=7200.0, resolve_factor=1.2,
                          hold_seconds=0.0)
    crit_exit = cfg.critical_seconds * cfg.resolve_factor
    warn_exit = cfg.warning_seconds * cfg.resolve_factor
    h = HorizonState()
    assert h.update(0, cfg.warning_seconds, True, cfg) == 0
    assert h.update(1, cfg.critical_seconds, True, cfg) == 1
    assert h.update(2, 100.0, True, cfg) == 2
    assert h.update(3, crit_exit, True, cfg) == 1  # at the critical exit: out of critical
    assert h.update(4, warn_exit, True, cfg) == 0  # at the warning exit: out of warning


def test_exactly_64_mib_free_is_enough_to_judge_how_scattered_it_is():
    m = Measures(fragmentation_ratio=0.1, largest_free_share=0.1, free_blocks_per_mb=0.1,
                 total_free_bytes=64 * MIB, smallest_free_block_bytes=300 * MIB)
    assert judge(m, Limits())[:2] == (1, "largest free block share")


def _firing(key, message):
    signal, uuid, pid, engine = key
    return Event(t=1.0, signal=signal, state="firing", gpu_uuid=uuid, pid=pid, engine=engine,
                 message=message)


def test_retain_resolves_only_the_conditions_whose_subject_is_gone():
    cond = Conditions()
    a, b = ("engine_down", None, None, "a"), ("engine_down", None, None, "b")
    fired_a = cond.set(1.0, _firing(a, "a down"), a)[0]
    cond.set(1.0, _firing(b, "b down"), b)
    (resolved,) = cond.retain(2.0, lambda key: key != a)
    assert (resolved.state, resolved.engine, resolved.ref) == ("resolved", "a", fired_a.id)
    assert list(cond.active) == [b]


def test_amend_replaces_only_the_event_it_names():
    cond = Conditions()
    a, b = ("memory_leak", "GPU-0", 1, None), ("memory_leak", "GPU-0", 2, None)
    (old,) = cond.set(1.0, _firing(a, "pid 1 leaks"), a)
    cond.set(1.0, _firing(b, "pid 2 leaks"), b)
    new = Event(t=1.0, signal="memory_leak", state="firing", gpu_uuid="GPU-0", pid=1,
                message="pid 1 (pod p) leaks")
    cond.amend(old, new)
    assert cond.active[a] is new
    assert cond.active[b].message == "pid 2 leaks"


def test_a_table_with_its_own_fragmentation_limits_is_judged_by_them():
    # A table whose row differs from the built-in defaults (spec §4), and a host override.
    table = SimpleNamespace(fragmentation=SimpleNamespace(fragmentation_ratio_max=0.2,
                                                          consecutive_samples=5))
    lim = Limits.resolve(table)
    assert (lim.fragmentation_ratio_max, lim.consecutive_samples) == (0.2, 5)
    assert lim.largest_free_share_min == Limits().largest_free_share_min  # not in the table
    host = SimpleNamespace(consecutive_samples=2, fragmentation_ratio_max=None)
    lim = Limits.resolve(table, host)
    assert (lim.fragmentation_ratio_max, lim.consecutive_samples) == (0.2, 2)


def test_a_probe_missing_a_figure_or_free_memory_gets_no_invented_ratio():
    def probe(**kw):
        base = dict(pid=7, reserved_bytes=GIB, inactive_split_bytes=GIB // 4,
                    total_free_bytes=0, largest_free_block_bytes=0, free_blocks=0)
        return ProbeSample(**{**base, **kw})

    m = measure(probe())
    assert m.fragmentation_ratio == 0.25
    # nothing free: no share of it, and no division by zero
    assert (m.largest_free_share, m.free_blocks_per_mb) == (None, None)
    assert measure(probe(inactive_split_bytes=None)).fragmentation_ratio is None
    assert measure(probe(reserved_bytes=None)).fragmentation_ratio is None
    # an allocator that holds nothing is not fragmented
    assert measure(probe(reserved_bytes=0, inactive_split_bytes=0)).fragmentation_ratio == 0.0


def test_a_largest_free_block_of_exactly_60_percent_is_healthy():
    m = Measures(fragmentation_ratio=0.1, largest_free_share=0.6, free_blocks_per_mb=0.1,
                 total_free_bytes=GIB, smallest_free_block_bytes=300 * MIB)
    assert judge(m, Limits())[0] == 0


class _Frag:
    """One probed process; each sample sets its free-memory shape."""

    def __init__(self, analyzer=None, **limits):
        self.analyzer = analyzer or FragmentationAnalyzer(Limits(consecutive_samples=1,
                                                                 **limits))
        self.derived, self.conditions, self.t = Derived(), Conditions(), 0.0

    def sample(self, largest_share=0.9, blocks_per_mib=0.1):
        self.t += 5.0
        free = 1024 * MIB
        probe = ProbeSample(pid=7, t=self.t, create_time=1.0, reserved_bytes=8 * GIB,
                            inactive_split_bytes=0, total_free_bytes=free,
                            largest_free_block_bytes=int(largest_share * free),
                            free_blocks=round(blocks_per_mib * 1024),
                            smallest_free_block_bytes=300 * MIB)
        gpu = GpuSample(index=0, uuid="GPU-f", name="NVIDIA A100-SXM4-80GB",
                        memory_total_bytes=80 * GIB, memory_used_bytes=40 * GIB,
                        processes=[ProcessSample(pid=7, create_time=1.0,
                                                 used_memory_bytes=9 * GIB)])
        return self.analyzer.update(Tick(t=self.t, gpus=[gpu], probes=[probe]), self.derived,
                                    self.conditions)


def test_an_episode_states_the_rule_that_fired_with_its_value_and_limit():
    (ev,) = _Frag().sample(largest_share=0.5)
    assert (ev.severity, ev.value, ev.threshold) == ("warning", 0.5, 0.6)
    assert ev.message.startswith("pid 7: allocator fragmented (largest free block share 50% "
                                 "against its limit 60%)")


def test_free_blocks_per_mib_leave_their_episode_10_percent_under_the_limit():
    run = _Frag()
    assert [e.state for e in run.sample(blocks_per_mib=0.9)] == ["firing"]
    assert run.sample(blocks_per_mib=0.75) == []  # under 0.8, not yet under 0.72: held
    assert [e.state for e in run.sample(blocks_per_mib=0.7)] == ["resolved"]


def test_a_largest_free_share_episode_ends_5_points_over_the_minimum():
    run = _Frag()
    assert [e.state for e in run.sample(largest_share=0.5)] == ["firing"]
    assert run.sample(largest_share=0.62) == []  # healthy again, not yet past 0.65: held
    assert [e.state for e in run.sample(largest_share=0.66)] == ["resolved"]
    # With a minimum of 98 %, the exit cannot be above 100 %: one free block ends it.
    run = _Frag(largest_free_share_min=0.98)
    assert [e.state for e in run.sample(largest_share=0.9)] == ["firing"]
    assert [e.state for e in run.sample(largest_share=1.0)] == ["resolved"]


def test_a_process_on_two_gpus_whose_probe_names_one_device_is_not_placed_by_guess():
    gpus = [GpuSample(index=i, uuid=f"GPU-{i}", memory_total_bytes=80 * GIB,
                      processes=[ProcessSample(pid=7)]) for i in (0, 1)]
    probes = [ProbeSample(pid=7, device=1, reserved_bytes=GIB),
              ProbeSample(pid=7, device=None, reserved_bytes=GIB)]
    assert locate(Tick(t=1.0, gpus=gpus, probes=probes)) == []
    # Two GPUs and no process lists at all (no host pid namespace): no GPU is guessed
    # either; with one GPU there is nothing to guess.
    bare = [GpuSample(index=i, uuid=f"GPU-{i}") for i in (0, 1)]
    assert locate(Tick(t=1.0, gpus=bare, probes=probes[:1])) == []
    assert [g.uuid for _, g in locate(Tick(t=1.0, gpus=bare[:1], probes=probes[:1]))] == [
        "GPU-0"]
    probes[1].device = 0  # both named: each record goes to its GPU in index order
    assert [(p.device, g.uuid) for p, g in locate(Tick(t=1.0, gpus=gpus, probes=probes))] == [
        (1, "GPU-1"), (0, "GPU-0")]


def test_fragmentation_is_judged_when_the_configuration_says_nothing_of_it():
    table = SimpleNamespace(fragmentation=SimpleNamespace(consecutive_samples=1))
    run = _Frag(FragmentationAnalyzer.from_config(SimpleNamespace(), table))
    assert [e.signal for e in run.sample(largest_share=0.5)] == ["fragmentation"]


def test_a_critical_episode_falls_to_the_highest_level_its_last_samples_keep():
    run = FragRun()
    assert [run.sample(x) for x in (2, 2, 2)] == [0, 0, 2]
    # risk, healthy, risk: no longer critical, still a warning
    assert [run.sample(x) for x in (1, 0, 1)] == [2, 2, 1]


def test_time_to_oom_names_the_rate_in_mib_per_second_and_an_hour_horizon_in_hours():
    cfg = load(None, environ={}, overrides={"signals": {"time_to_oom": {
        "critical_seconds": 3600.0}}})
    events, _ = run_leak(60 * MIB, 40 * GIB, 3600 + 150, cfg=cfg)
    (first, *_) = [e for e in events if e.signal == "time_to_oom"]
    assert "(under the critical horizon of 1.0 h)" in first.message
    # about 32 GiB of headroom at 60 MiB/s: nine minutes or so
    minutes = re.search(r"budget in ([0-9]+) min at", first.message)
    assert minutes and 5 <= int(minutes.group(1)) <= 10, first.message
    rate = re.search(r" at ([0-9.]+) MiB/s ", first.message)
    assert rate and 54 <= float(rate.group(1)) <= 66, first.message


def test_no_time_to_oom_without_a_leak_even_close_to_the_budget():
    # Memory that no process accounts for grows 5 MiB/min, under the warning slope, from
    # 300 MiB under the budget: the memory zone says how full the GPU is; time to OOM
    # speaks only of a leak.
    pipeline = Pipeline(load(None, environ={}), load_table())
    base = OOM_BUDGET - 800 * MIB
    events = []
    for i in range(1800):
        el = i * 3.0
        events += pipeline.update(Tick(t=T0 + el, gpus=[GpuSample(
            index=0, uuid="GPU-0", name="NVIDIA A100-SXM4-80GB", memory_total_bytes=80 * GIB,
            memory_used_bytes=int(base + 500 * MIB + 5 * MIB / 60 * el),
            processes=[ProcessSample(pid=7, name="serve", used_memory_bytes=int(base),
                                     create_time=T0 - 7200)])]))
    assert pipeline.derived.gpus["GPU-0"].leak_rate_bytes_per_second > 0
    assert [e for e in events if e.signal in ("memory_leak", "time_to_oom")] == []
    assert pipeline.derived.gpus["GPU-0"].time_to_oom_severity == 0


def test_a_disabled_zone_judges_nothing_even_in_the_red():
    events, derived = zone_run([zone_gpu(75000 * MIB)] * 3, enabled=False)
    assert events == [] and derived.gpus["GPU-0"].zone is None


def test_a_slow_leak_with_room_reads_in_mib_per_minute_and_says_nothing_of_oom():
    events, _ = run_leak(30 * MIB / 60, 10 * GIB, 3600 + 45 * 60)
    (warning,) = [e for e in events if e.signal == "memory_leak"]
    assert warning.severity == "warning" and "time to OOM" not in warning.message
    rate = re.fullmatch(r"pid 7 \(train\) on GPU 0: retained memory grows ([0-9.]+) MiB/min"
                        r"(?: over [0-9.]+ (?:s|min|h))?, "
                        r"at or above 10\.8 MiB/min \(warning slope 12\.0 MiB/min less 10% "
                        r"tolerance\)", warning.message)
    assert rate and 24 <= float(rate.group(1)) <= 36, warning.message


def test_the_zone_follows_the_table_it_is_given(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text('version = "2.3.1-site.1"\nextends = "2.3.1"\n'
                    '[[rows]]\nid = "a100-80gb"\nwarning_above_mib = 50000\n')
    used = 55000 * MIB  # safe by the shipped row, a warning by the site's
    analyzer = MemoryAnalyzer(None, load_table(site))
    derived, cond = Derived(), Conditions()
    for i in range(3):
        analyzer.update(Tick(t=T0 + 2 * i, gpus=[zone_gpu(used)]), derived, cond)
    assert derived.gpus["GPU-0"].zone == 1
    assert derived.threshold_table["version"] == "2.3.1-site.1"


def test_with_prefer_probe_off_nvml_is_followed_even_where_a_probe_reports():
    def make(el):
        reserved = 8 * GIB + WARN * 2 * max(0.0, el - 3600.0)  # the probe sees growth
        probe = ProbeSample(pid=11, t=T0 + el, reserved_bytes=int(reserved))
        return gpu_tick(T0 + el, [(11, 9 * GIB, T0 - 3600)], probes=[probe])  # NVML flat

    cfg = load(None, environ={}, overrides={"signals": {"leak": {"prefer_probe": False}}})
    events = run_ticks(Pipeline(cfg, load_table()), make, 2.5 * 3600)
    assert [e for e in events if e.signal == "memory_leak"] == []


def _probe_leak_events(probe_created_later_by: float = 0.0, age: float = 0.0, devices=(0,)):
    created = T0 - 3600

    def make(el):
        probes = [ProbeSample(pid=11, t=T0 + el - age, device=d,
                              reserved_bytes=int(8 * GIB + 64 * MIB * el),
                              create_time=created + probe_created_later_by) for d in devices]
        return gpu_tick(T0 + el, [(11, 9 * GIB, created)], probes=probes)  # NVML flat

    events = run_ticks(Pipeline(load(None, environ={}), load_table()), make, 120, dt=2.0)
    return [e for e in events if e.signal == "memory_leak"]


def test_a_probe_record_up_to_30_s_old_is_followed_and_an_older_one_is_not():
    assert [e.severity for e in _probe_leak_events(age=30.0)] == ["critical"]
    assert _probe_leak_events(age=30.5) == []
    # a record for each of two devices: which GPU is which is not known here, NVML decides
    assert _probe_leak_events(devices=(0, 1)) == []
    assert [e.severity for e in _probe_leak_events(devices=(0, 0))] == ["critical"]


def test_a_probe_is_the_same_process_within_a_second_of_its_create_time():
    (ev,) = _probe_leak_events(1.0)
    assert ev.severity == "critical" and "allocator reserved memory" in ev.message
    assert ev.message.endswith("(critical slope 50.0 MiB/s less 10% tolerance)")
    # further apart: another process that once had this pid; NVML's flat figure is followed
    assert _probe_leak_events(1.5) == []


def test_an_idle_gpu_without_processes_leaks_nothing():
    analyzer, derived = MemoryAnalyzer(), Derived()
    gpu = GpuSample(index=0, uuid="GPU-0", name="NVIDIA A100-SXM4-80GB",
                    memory_total_bytes=80 * GIB, memory_used_bytes=600 * MIB)
    analyzer.update(Tick(t=T0, gpus=[gpu]), derived, Conditions())
    assert derived.gpus["GPU-0"].leak_rate_bytes_per_second == 0.0


def test_a_leak_goes_on_through_samples_that_lack_the_create_time():
    created = T0 - 3600

    def make(el):
        used = 8 * GIB + 64 * MIB * el
        return gpu_tick(T0 + el, [(11, used, None if 80 <= el < 90 else created)])

    events = run_ticks(Pipeline(load(None, environ={}), load_table()), make, 150, dt=2.0)
    assert [(e.signal, e.state) for e in events if e.signal == "memory_leak"] == [
        ("memory_leak", "firing")]


def test_unplanned_memory_is_zero_when_the_pool_holds_it_all():
    used = 0.8 * 80 * GIB
    engines = {"vllm-0": SimpleNamespace(kind="vllm", pids=[100], cache_config={})}
    events, derived = zone_run([zone_gpu(used, [(100, used)])] * 3, engines)
    assert events == [] and derived.gpus["GPU-0"].unplanned_memory_bytes == 0.0
    # the zone's notes are those of the last sample, not one more per sample
    assert len(derived.gpus["GPU-0"].notes) == 1
    # pools not recognised: all of it is unplanned
    _, derived = zone_run([zone_gpu(used, [(100, used)])] * 3, engines, planned_pools=False)
    assert derived.gpus["GPU-0"].unplanned_memory_bytes == used


def _gpu_level_leak(process_ages):
    # NVML gives no per-process figures: the GPU's own series is all there is.
    def make(el):
        procs = [(pid, None, T0 - age) for pid, age in enumerate(process_ages, 1)]
        return gpu_tick(T0 + el, procs, used=8 * GIB + 64 * MIB * el)

    events = run_ticks(Pipeline(load(None, environ={}), load_table()), make, 120, dt=2.0)
    return [(e.severity, e.pid) for e in events if e.signal == "memory_leak"]


def test_a_gpu_whose_processes_are_old_is_judged_at_once_and_a_young_one_waits():
    assert _gpu_level_leak([7200, 3600]) == [("critical", None)]
    # one process just started: the GPU is as young as it, its growth may be loading
    assert _gpu_level_leak([7200, 0]) == []


def test_a_gone_process_and_a_gone_gpu_are_kept_for_the_horizon_then_resolved():
    created = T0 - 3600
    gone_after = 100.0

    def make(el):
        gpus = [GpuSample(index=0, uuid="GPU-0", name="NVIDIA A100-SXM4-80GB",
                          memory_total_bytes=80 * GIB, memory_used_bytes=int(40 * GIB),
                          processes=[ProcessSample(pid=22, used_memory_bytes=5 * GIB,
                                                   create_time=created)])]
        if el < gone_after:
            used = int(8 * GIB + 64 * MIB * el)
            gpus[0].processes.append(ProcessSample(pid=11, create_time=created,
                                                   used_memory_bytes=used))
            gpus.append(GpuSample(index=1, uuid="GPU-1", name="NVIDIA A100-SXM4-80GB",
                                  memory_total_bytes=80 * GIB,
                                  memory_used_bytes=75000 * MIB))
        return Tick(t=T0 + el, gpus=gpus)

    pipeline = Pipeline(load(None, environ={}), load_table())
    seen = [(e.t - T0, e.signal, e.state, e.pid, e.gpu_uuid)
            for i in range(120) for e in pipeline.update(make(i * 2.0))
            if e.signal in ("memory_leak", "memory_zone")]
    firing = [s for s in seen if s[2] == "firing"]
    assert {(s[1], s[3], s[4]) for s in firing} == {
        ("memory_leak", 11, "GPU-0"), ("memory_zone", None, "GPU-1")}
    assert all(s[0] < gone_after for s in firing)
    # last seen at 98 s; forgotten once more than 60 s have passed: at 160 s, not 158 s
    assert [s for s in seen if s[2] == "resolved"] == [
        (160.0, "memory_leak", "resolved", 11, "GPU-0"),
        (160.0, "memory_zone", "resolved", None, "GPU-1")]


def test_the_zone_event_states_the_unplanned_memory_and_the_limit_in_mib():
    events, _ = zone_run([zone_gpu(75000 * MIB)] * 3)
    assert [e.message for e in events] == [
        "GPU 0: 75000 MiB of unplanned memory is in the critical zone (above 73500 MiB, "
        "calibrated row a100-80gb, table 2.3.1)"]


@pytest.mark.xfail(strict=True, reason=(
    "known: a warning resolves once the scale it fired on is flat for its hold; 18 min flat "
    "ends the episode and the leak that resumes is a second one"))
def test_a_slow_leak_that_pauses_for_18_minutes_is_still_one_episode():
    # 40 MiB/min for 1.5 h, 18 min flat, then on again: the warning's exit is judged on the
    # whole trend window as well as the recent one, so one quiet stretch does not end it.
    s = series()
    onset, pause_at, pause = 600.0, 6000.0, 1080.0

    def memory(el):
        grown = min(el, pause_at) - onset if el > onset else 0.0
        grown += max(0.0, el - pause_at - pause)
        return 20 * GIB + saw(el) + 40 * MIB / 60 * grown

    changes = feed(s, memory, pause_at + pause + 3600)
    assert [level for _, level in changes] == [1]
