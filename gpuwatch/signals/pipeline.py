"""The analyzers the live daemon and `gpuwatch replay` both run, in order."""

from __future__ import annotations

import logging
from typing import Protocol

from gpuwatch.events import Event
from gpuwatch.model import Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.engine import EngineAnalyzer
from gpuwatch.signals.fragmentation import FragmentationAnalyzer
from gpuwatch.signals.memory import MemoryAnalyzer

log = logging.getLogger(__name__)


class Analyzer(Protocol):
    def update(self, tick: Tick, derived: Derived, conditions: Conditions) -> list[Event]: ...


def build_analyzers(config, table) -> list[Analyzer]:
    """Every analyzer, in the order they run (later ones may read what earlier ones set)."""
    return [
        EngineAnalyzer(config),  # first: later analyzers read derived.engines
        # memory (zone, leak, time to OOM) reads the engines' planned pools
        MemoryAnalyzer(config, table),
        FragmentationAnalyzer.from_config(config, table),  # probes (spec §4)
    ]


class Pipeline:
    def __init__(self, config, table=None) -> None:
        self.config = config
        self.table = table
        self.derived = Derived()
        self.conditions = Conditions()
        self.analyzers = build_analyzers(config, table)
        self.errors = 0

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
            try:
                events += analyzer.update(tick, self.derived, self.conditions)
            except Exception:
                # One analyzer's bug costs its own conclusions for this tick, nothing else.
                self.errors += 1
                log.exception("analyzer %s failed at t=%s", type(analyzer).__name__, tick.t)
        return events

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
