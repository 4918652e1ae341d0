"""The series budget's output side: the series of processes the budget folds (signals/budget.py)
are summed per GPU and owner, or left out, family by family.

Every per-process family (one with a `pid` label) is registered here, once, with what its
folded processes become:
- SUM: one series per group (every label but `pid` and `process`, which are empty): the
  group's total, so `sum by (gpu)` or `sum by (pod)` is the same whichever processes are
  folded. A counter's group total only grows: it adds what each folded process counted while
  folded (a process that joins or leaves the group moves no count).
- DROP: nothing (identity, start times, the leak estimate and verdict of processes whose
  verdict is none; a judged process, one with a probe or an OOM is never folded).
A family not registered is dropped for folded processes too (the budget holds), and
tests/test_series_budget.py names it so that its author chooses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gpuwatch.exporter.metric import GaugeMetricFamily, Metric, Sample
from gpuwatch.exporter.snapshot import Snapshot

SUM, DROP = "sum", "drop"
FOLDED = {"pid": "", "process": ""}

PER_PROCESS: dict[str, str] = {
    "gpuwatch_process_gpu_memory_used_bytes": SUM,
    "gpuwatch_process_resident_memory_bytes": SUM,
    "gpuwatch_process_cpu_seconds": SUM,
    "gpuwatch_process_utilization_ratio": SUM,
    "gpuwatch_process_info": DROP,
    "gpuwatch_process_start_time_seconds": DROP,
    "gpuwatch_process_memory_leak_rate_bytes_per_second": DROP,
    "gpuwatch_process_time_to_oom_seconds": DROP,
    "gpuwatch_process_memory_leak_severity": DROP,
    # only processes with a probe or a recent OOM have these, and those are never folded
    **{f"gpuwatch_process_allocator_{n}": DROP for n in (
        "allocated_bytes", "reserved_bytes", "inactive_split_bytes", "free_bytes",
        "largest_free_block_bytes", "free_blocks", "alloc_retries", "ooms",
        "fragmentation_ratio", "unattributed_bytes")},
    "gpuwatch_process_ooms": DROP,
    "gpuwatch_process_oom_lead_time_seconds": DROP,
}


def _group(labels: dict[str, str]) -> tuple:
    return tuple(sorted({**labels, **FOLDED}.items()))


class Folder:
    """Lives as long as the renderer: a folded counter's group total spans renders."""

    def __init__(self) -> None:
        # per counter family: group -> total, and (uuid, pid, sample) -> the value last
        # seen while folded
        self._totals: dict[str, dict[tuple, float]] = {}
        self._last: dict[str, dict[tuple, float]] = {}
        self.unregistered: set[str] = set()

    def fold(self, snap: Snapshot, metrics: Iterable[Metric]) -> Iterator[Metric]:
        exported = snap.derived.budget.exported
        for m in metrics:
            if exported is None or not any("pid" in s.labels for s in m.samples[:1]):
                yield m
                continue
            policy = PER_PROCESS.get(m.name)
            if policy is None:
                self.unregistered.add(m.name)
            kept: list[Sample] = []
            sums: dict[tuple, float] = {}
            last, totals = self._last.get(m.name, {}), self._totals.get(m.name, {})
            seen: dict[tuple, float] = {}
            for s in m.samples:
                pid, uuid = s.labels.get("pid", ""), s.labels.get("uuid", "")
                if not pid or (uuid, _int(pid)) in exported:
                    kept.append(s)
                elif policy == SUM:
                    key = (s.name, _group(s.labels))
                    if m.type == "counter":
                        member = (uuid, pid, s.name)
                        seen[member] = s.value
                        gained = s.value - last.get(member, s.value)
                        sums[key] = totals.get(key, 0.0) + max(gained, 0.0)
                        totals[key] = sums[key]
                    else:
                        sums[key] = sums.get(key, 0.0) + s.value
            if m.type == "counter":
                # a group without folded processes left; its total with it
                self._totals[m.name] = {k: v for k, v in totals.items() if k in sums}
                self._last[m.name] = seen
            m.samples = kept + [Sample(name, dict(group), v) for (name, group), v in sums.items()]
            yield m

    @staticmethod
    def folded_metric(snap: Snapshot) -> Metric | None:
        sel = snap.derived.budget
        if sel.exported is None or snap.tick is None:
            return None
        fam = GaugeMetricFamily(
            "gpuwatch_processes_folded",
            "Processes on the GPU without series of their own (the series budget): their "
            "memory, CPU and utilization are summed in the series whose pid is empty.",
            labels=["gpu", "uuid"])
        for g in snap.tick.gpus:
            fam.add_metric([str(g.index), g.uuid], sel.folded.get(g.uuid, 0))
        return fam


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1
