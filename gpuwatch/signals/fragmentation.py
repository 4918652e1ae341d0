"""Allocator fragmentation per process (spec §4), from what in-process probes report.

Measures, per (GPU, pid), from one probe sample:
  fragmentation_ratio  = inactive_split / reserved: the share of the allocator's pool that is
                         free but stuck in split segments (empty_cache() cannot return it).
                         This is `gpuwatch_process_allocator_fragmentation_ratio`; the
                         table's `fragmentation_ratio_max` (35 %) applies to it.
  largest_free_share   = largest free block / total free (1 - it is how scattered the free
                         memory is); healthy at ≥ `largest_free_share_min` (60 %).
  free_blocks_per_mb   = free-block count / total free MiB; healthy at ≤ 0.8.
  unattributed_bytes   = NVML's per-process used - allocator reserved (CUDA context, NCCL,
                         other libraries), whenever both are known.
Without a probe nothing is set: no number is invented.

Judgement of one sample:
  risk (warning)   the ratio is over its maximum, or — when at least MIN_JUDGED_FREE_BYTES is
                   free (a few MiB in a handful of blocks would otherwise trip the per-MiB
                   rules on every healthy server) — the largest-free share is under its
                   minimum or the free blocks per MiB over theirs;
  act (critical)   risk, and the free blocks add up to less than `act_when_free_below` and
                   the smallest is under `smallest_free_block_min` (a cache compaction,
                   i.e. a flush, is due).
A level fires after `consecutive_samples` probe samples at or above it, and falls back
after as many samples below it by the exit band (`EXIT_BAND`: the ratio 0.05 under its
maximum, the largest-free share 0.05 over its minimum, blocks per MiB 10 % under theirs), so
a value that hovers at a limit is one episode. Samples are counted by the probe's own
timestamp, so a record the daemon reads on several ticks counts once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from gpuwatch.events import Event
from gpuwatch.model import GpuSample, ProbeSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived

MIB = 1024 * 1024
MIN_JUDGED_FREE_BYTES = 64 * MIB
SIGNAL = "fragmentation"
EXIT_BAND = 0.05  # share; blocks per MiB leave 10 % under their maximum


@dataclass(frozen=True)
class Limits:
    """Spec §4 (table v2.3.1); the threshold table and signals.fragmentation override."""

    largest_free_share_min: float = 0.60
    free_blocks_per_mb_max: float = 0.8
    smallest_free_block_min_bytes: int = 256 * MIB
    act_when_free_below_bytes: int = 512 * MIB
    fragmentation_ratio_max: float = 0.35
    consecutive_samples: int = 3

    def exit_limits(self) -> Limits:
        """The limits a firing level must be back under to count as below it."""
        return replace(
            self,
            fragmentation_ratio_max=max(0.0, self.fragmentation_ratio_max - EXIT_BAND),
            largest_free_share_min=min(1.0, self.largest_free_share_min + EXIT_BAND),
            free_blocks_per_mb_max=self.free_blocks_per_mb_max * (1 - 2 * EXIT_BAND),
        )

    @classmethod
    def resolve(cls, table=None, overrides=None) -> Limits:
        limits = cls()
        frag = getattr(table, "fragmentation", None) if table is not None else None
        if frag is not None:
            limits = cls(**{f: getattr(frag, f) for f in cls.__dataclass_fields__
                            if getattr(frag, f, None) is not None})
        if overrides is not None:
            set_here = {f: getattr(overrides, f) for f in cls.__dataclass_fields__
                        if getattr(overrides, f, None) is not None}
            limits = replace(limits, **set_here)
        return limits


@dataclass
class Measures:
    fragmentation_ratio: float | None = None
    largest_free_share: float | None = None
    free_blocks_per_mb: float | None = None
    smallest_free_block_bytes: int | None = None
    total_free_bytes: int | None = None


def measure(probe: ProbeSample) -> Measures:
    m = Measures()
    if probe.reserved_bytes is not None and probe.inactive_split_bytes is not None:
        m.fragmentation_ratio = (probe.inactive_split_bytes / probe.reserved_bytes
                                 if probe.reserved_bytes > 0 else 0.0)
    free = probe.total_free_bytes
    m.total_free_bytes = free
    m.smallest_free_block_bytes = probe.smallest_free_block_bytes
    if free is not None and free > 0:
        if probe.largest_free_block_bytes is not None:
            m.largest_free_share = probe.largest_free_block_bytes / free
        if probe.free_blocks is not None:
            m.free_blocks_per_mb = probe.free_blocks / (free / MIB)
    return m


def judge(m: Measures, lim: Limits) -> tuple[int, str, float | None, float | None]:
    """(level 0/1/2, which rule, its value, its threshold) for one sample."""
    rule, value, threshold = "", None, None
    if m.fragmentation_ratio is not None and m.fragmentation_ratio > lim.fragmentation_ratio_max:
        rule, value, threshold = ("inactive_split/reserved", m.fragmentation_ratio,
                                  lim.fragmentation_ratio_max)
    elif (m.total_free_bytes or 0) >= MIN_JUDGED_FREE_BYTES:
        if (m.largest_free_share is not None
                and m.largest_free_share < lim.largest_free_share_min):
            rule, value, threshold = ("largest free block share", m.largest_free_share,
                                      lim.largest_free_share_min)
        elif (m.free_blocks_per_mb is not None
              and m.free_blocks_per_mb > lim.free_blocks_per_mb_max):
            rule, value, threshold = ("free blocks per MiB", m.free_blocks_per_mb,
                                      lim.free_blocks_per_mb_max)
    if not rule:
        return 0, "", None, None
    act = (m.total_free_bytes is not None
           and m.total_free_bytes < lim.act_when_free_below_bytes
           and m.smallest_free_block_bytes is not None
           and m.smallest_free_block_bytes < lim.smallest_free_block_min_bytes)
    return (2 if act else 1), rule, value, threshold


def locate(tick: Tick) -> list[tuple[ProbeSample, GpuSample]]:
    """Each probe sample with the GPU it describes.

    By the GPU UUID the probe reports where the recording has it; else by the pid in NVML's
    process lists (a process on several GPUs: its devices in order against those GPUs in
    index order, as CUDA numbers them by default); else the only GPU of the host.
    """
    if not tick.probes:
        return []
    by_uuid = {g.uuid: g for g in tick.gpus}
    wanted = {s.pid for s in tick.probes}  # a host has far more processes than probes
    hosts: dict[int, list[GpuSample]] = {}
    for g in tick.gpus:
        for p in g.processes:
            if p.pid in wanted:
                hosts.setdefault(p.pid, []).append(g)
    devices: dict[int, list[int | None]] = {}
    for s in tick.probes:
        devices.setdefault(s.pid, []).append(s.device)
    out = []
    for s in tick.probes:
        uuid = s.gpu_uuid
        gpu = by_uuid.get(uuid) if uuid else None
        if gpu is None:
            on = sorted(hosts.get(s.pid, ()), key=lambda g: g.index)
            if len(on) == 1:
                gpu = on[0]
            elif len(on) > 1:
                mine = sorted(d for d in devices[s.pid] if d is not None)
                if len(mine) == len(on) and s.device is not None:
                    gpu = on[mine.index(s.device)]
            elif len(tick.gpus) == 1 and not any(g.processes for g in tick.gpus):
                gpu = tick.gpus[0]  # NVML lists no processes here (e.g. no hostPID)
        if gpu is not None:
            out.append((s, gpu))
    return out


@dataclass
class _Track:
    create_time: float | None
    last_t: float | None = None
    levels: deque = field(default_factory=deque)  # judged on the limits (entry)
    keeps: deque = field(default_factory=deque)  # judged on the exit limits
    active: int = 0


class FragmentationAnalyzer:
    def __init__(self, limits: Limits | None = None, *, emit: bool = True) -> None:
        self.limits = limits or Limits()
        self._exit = self.limits.exit_limits()
        self.emit = emit
        self._tracks: dict[tuple[str, int], _Track] = {}

    @classmethod
    def from_config(cls, config, table) -> FragmentationAnalyzer:
        section = getattr(getattr(config, "signals", None), "fragmentation", None)
        return cls(Limits.resolve(table, section),
                   emit=getattr(section, "enabled", True))

    def update(self, tick: Tick, derived: Derived, conditions: Conditions) -> list[Event]:
        events: list[Event] = []
        seen: set[tuple[str, int]] = set()
        for probe, gpu in locate(tick):
            key = (gpu.uuid, probe.pid)
            if key in seen:
                continue
            seen.add(key)
            m = measure(probe)
            ps = derived.process(gpu.uuid, probe.pid)
            ps.fragmentation_ratio = m.fragmentation_ratio
            ps.largest_free_share = m.largest_free_share
            ps.free_blocks_per_mb = m.free_blocks_per_mb
            used = next((p.used_memory_bytes for p in gpu.processes if p.pid == probe.pid), None)
            ps.unattributed_bytes = (float(used - probe.reserved_bytes)
                                     if used is not None and probe.reserved_bytes is not None
                                     else None)
            if self.emit:
                events += self._judge(tick.t, gpu.uuid, probe, m, conditions)
        for key in [k for k in self._tracks if k not in seen]:
            # The probe (or its process) is gone: nothing is known any more.
            del self._tracks[key]
            events += conditions.set(tick.t, None, (SIGNAL, key[0], key[1], None))
        return events

    def _judge(self, t: float, uuid: str, probe: ProbeSample, m: Measures,
               conditions: Conditions) -> list[Event]:
        key = (uuid, probe.pid)
        cond_key = (SIGNAL, uuid, probe.pid, None)
        n = self.limits.consecutive_samples
        out: list[Event] = []
        track = self._tracks.get(key)
        if track is None or track.create_time != probe.create_time:
            # A new process under an old pid starts from nothing.
            track = self._tracks[key] = _Track(create_time=probe.create_time)
            out += conditions.set(t, None, cond_key)
        level, rule, value, threshold = judge(m, self.limits)
        if probe.t is None or probe.t != track.last_t:
            track.last_t = probe.t
            track.levels.append(level)
            track.keeps.append(judge(m, self._exit)[0])
            while len(track.levels) > n:
                track.levels.popleft()
                track.keeps.popleft()
            if len(track.levels) == n:
                if min(track.levels) > track.active:
                    track.active = min(track.levels)
                elif max(track.keeps) < track.active:
                    track.active = max(track.keeps)
        ev = None
        if track.active:
            severity = "critical" if track.active == 2 else "warning"
            if value is None:  # held through a sample below the level: report the ratio
                rule, value = "inactive_split/reserved", m.fragmentation_ratio
                threshold = self.limits.fragmentation_ratio_max
            ev = Event(t=t, signal=SIGNAL, state="firing", severity=severity, gpu_uuid=uuid,
                       pid=probe.pid, value=value, threshold=threshold,
                       message=_message(probe.pid, rule, value, threshold, m, severity))
        return out + conditions.set(t, ev, cond_key)


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.0f}%" if pct else f"{x:.2f}"


def _message(pid: int, rule: str, value: float | None, threshold: float | None, m: Measures,
             severity: str) -> str:
    free = "n/a" if m.total_free_bytes is None else f"{m.total_free_bytes / MIB:.0f} MiB"
    pct = rule != "free blocks per MiB"
    judged = f"{_fmt(value, pct)} against its limit {_fmt(threshold, pct)}"
    text = (f"pid {pid}: allocator fragmented ({rule} {judged}): inactive_split/reserved "
            f"{_fmt(m.fragmentation_ratio, True)}, largest free block "
            f"{_fmt(m.largest_free_share, True)} of {free} free, "
            f"{_fmt(m.free_blocks_per_mb)} free blocks/MiB, as measured when this event fired "
            f"(the current figures are in /api/state)")
    if severity == "critical":
        text += "; little free memory left in small blocks: a cache flush is due"
    return text
