"""Metric families, one module per domain. Each module has collect(snap) -> metrics.

The custom collector calls every module listed here over the same immutable Snapshot;
a module that raises loses only its own families for that scrape.
"""

from __future__ import annotations

import importlib

MODULES = (
    "gpuwatch.exporter.families.self_metrics",
    "gpuwatch.exporter.families.gpu",
    "gpuwatch.exporter.families.gpu_depth",
    "gpuwatch.exporter.families.process",
    "gpuwatch.exporter.families.engines",
    "gpuwatch.exporter.families.serving",
    "gpuwatch.exporter.families.memory_signals",
    "gpuwatch.exporter.families.remediation",
    "gpuwatch.exporter.families.allocator",
    "gpuwatch.exporter.families.attribution",
    "gpuwatch.exporter.families.oom",
    "gpuwatch.exporter.families.http",
    "gpuwatch.exporter.families.otlp",
)


def modules():
    return [importlib.import_module(name) for name in MODULES]
