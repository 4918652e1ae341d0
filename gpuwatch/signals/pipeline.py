"""The analyzers the live daemon and `gpuwatch replay` both run, in order."""

from __future__ import annotations

import logging
from typing import Protocol

import msgspec

from gpuwatch.events import Event
from gpuwatch.model import ATTRIBUTION_FIELDS, ProcessSample, Tick
from gpuwatch.signals.budget import Budget, BudgetConfig, Selection
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.engine_memory import EngineMemoryAnalyzer
from gpuwatch.signals.fragmentation import FragmentationAnalyzer
from gpuwatch.signals.memory import MemoryAnalyzer
from gpuwatch.signals.process_oom import OomAnalyzer

log = logging.getLogger(__name__)


def _by_key(tick: Tick) -> dict[tuple[str, int], ProcessSample]:
    return {(g.uuid, p.pid): p for g in tick.gpus for p in g.processes}


class Analyzer(Protocol):
    def update(self, tick: Tick, derived: Derived, conditions: Conditions) -> list[Event]: ...


class Engines:
    """The engine analyzer, built at the first tick that carries an engine. Until then it
    has nothing to judge, and a host with no engine (the default) never imports the
    engines' exposition parsers and serving signals (over a MiB of the daemon's memory)."""

    def __init__(self, config) -> None:
        self.config = config
        self.analyzer = None

    def update(self, tick: Tick, derived: Derived, conditions: Conditions) -> list[Event]:
        if self.analyzer is None:
            if not tick.engines:
                return []
            from gpuwatch.signals.engine import EngineAnalyzer

            self.analyzer = EngineAnalyzer(self.config)
        return self.analyzer.update(tick, derived, conditions)


def build_analyzers(config, table) -> list[Analyzer]:
    """Every analyzer, in the order they run (later ones may read what earlier ones set)."""
    return [
        Engines(config),  # first: later analyzers read derived.engines
        # memory (zone, leak, time to OOM) reads the engines' planned pools
        MemoryAnalyzer(config, table),
        FragmentationAnalyzer.from_config(config, table),  # probes (spec §4)
        EngineMemoryAnalyzer(config),  # the engines' own memory plans beside NVML's
        OomAnalyzer(config),  # last: names the leak, time-to-OOM or zone event before an OOM
    ]


class Pipeline:
    def __init__(self, config, table=None, strict: bool = False) -> None:
        self.config = config
        # benchmarks and tests: an analyzer's bug raises, rather than costing its conclusions
        # quietly (figures measured past it would be wrong)
        self.strict = strict
        self.table = table
        self.derived = Derived()
        self.conditions = Conditions()
        self.analyzers = build_analyzers(config, table)
        self.budget = Budget(getattr(config, "budget", None) or BudgetConfig())
        self.errors = 0
        # The last tick with GPUs: names the owner of a process in the event that resolves
        # its condition after it exited.
        self._last: Tick | None = None

    @classmethod
    def from_config(cls, config) -> Pipeline:
        """With the threshold table the configuration names (the shipped one by default);
        raises ThresholdsError for a bad override file."""
        from gpuwatch.thresholds import load_table

        return cls(config, load_table(config.thresholds.file or None))

    def update(self, tick: Tick) -> list[Event]:
        self._prune(tick)
        events: list[Event] = []
        for analyzer in self.analyzers:
            if tick.engines_only and not isinstance(analyzer, Engines):
                continue  # it samples the host: this tick has nothing of it
            try:
                events += analyzer.update(tick, self.derived, self.conditions)
            except Exception:
                if self.strict:
                    raise
                # One analyzer's bug costs its own conclusions for this tick, nothing else.
                self.errors += 1
                log.exception("analyzer %s failed at t=%s", type(analyzer).__name__, tick.t)
        events = self._attribute(tick, events)
        try:
            self.derived.budget = self.budget.update(tick, self.derived, events, self.active)
        except Exception:  # the selection is an output's: without it, every process exports
            self.errors += 1
            self.derived.budget = Selection()
            log.exception("series budget failed at t=%s", tick.t)
        return events

    def _attribute(self, tick: Tick, events: list[Event]) -> list[Event]:
        """Name the pod/container/Slurm job of a process event, from the sample (so replay
        names them as the live run did). Before publication: events are immutable, so an
        attributed event replaces the one the conditions hold."""
        out = []
        if events:  # rare: the processes are indexed only then
            live = _by_key(tick)
            seen = _by_key(self._last) if self._last is not None else {}
        for ev in events:
            if ev.pid is None:
                proc = self._sole_owner(tick, ev.gpu_uuid)
            else:
                proc = live.get((ev.gpu_uuid, ev.pid)) or seen.get((ev.gpu_uuid, ev.pid))
            owner = {name: getattr(proc, name) for name in ATTRIBUTION_FIELDS
                     if proc is not None and getattr(proc, name)}
            if owner:
                named = msgspec.structs.replace(ev, **owner)
                self.conditions.amend(ev, named)
                ev = named
            out.append(ev)
        if tick.gpus:
            self._last = tick
        return out

    @staticmethod
    def _sole_owner(tick: Tick, uuid: str | None) -> ProcessSample | None:
        """A GPU event names the owner when every process on the GPU has the same one."""
        procs = next((g.processes for g in tick.gpus if g.uuid == uuid), [])
        owners = {tuple(getattr(p, f) for f in ATTRIBUTION_FIELDS) for p in procs}
        return procs[0] if len(owners) == 1 else None

    def _prune(self, tick: Tick) -> None:
        """Forget GPUs and processes that are no longer there, so their series disappear."""
        if not tick.gpus:
            return
        live = {(g.uuid, p.pid) for g in tick.gpus for p in g.processes}
        for key in [k for k in self.derived.processes if k not in live]:
            del self.derived.processes[key]
        uuids = {g.uuid for g in tick.gpus}
        for uuid in [u for u in self.derived.gpus if u not in uuids]:
            del self.derived.gpus[uuid]

    @property
    def active(self) -> list[Event]:
        return list(self.conditions.active.values())
