"""The versioned threshold table: rows per GPU model, leak slopes, fragmentation limits,
OOM headroom parameters."""

from gpuwatch.thresholds.table import (
    DEFAULT_VERSION,
    Action,
    Row,
    ThresholdsError,
    ThresholdTable,
    available_versions,
    load_table,
)

__all__ = [
    "DEFAULT_VERSION",
    "Action",
    "Row",
    "ThresholdTable",
    "ThresholdsError",
    "available_versions",
    "load_table",
]
