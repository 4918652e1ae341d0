"""The threshold table's file format (TOML): what each key is and which values it takes."""

from __future__ import annotations

from typing import Annotated

import msgspec

Positive = Annotated[float, msgspec.Meta(gt=0)]
NonNeg = Annotated[float, msgspec.Meta(ge=0)]
Ratio = Annotated[float, msgspec.Meta(ge=0, le=1)]
Share = Annotated[float, msgspec.Meta(ge=0, lt=1)]

FORMAT = "gpuwatch-thresholds"
HOOKS = ("snapshot", "signal", "flush", "exec")


class Struct(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class ActionSpec(Struct, kw_only=True):
    hook: str
    signal: str = ""  # for hook = "signal", e.g. SIGUSR1
    kind: str = ""  # for hook = "snapshot": allocator | history

    def __post_init__(self) -> None:
        if self.hook not in HOOKS:
            raise ValueError(f"hook: {self.hook!r} is not one of {', '.join(HOOKS)}")


class RowSpec(Struct, kw_only=True):
    id: str
    model: str = ""
    # Regular expressions searched (case-insensitively) in the NVML device name.
    match: list[str]
    memory_total_mib: Positive
    # Zone starts: memory above warning_above is yellow, above critical_above red. A row
    # without them (illegible in the source) is judged by the derivation rule.
    warning_above_mib: Positive | None = None
    critical_above_mib: Positive | None = None
    on_critical: list[ActionSpec] | None = None
    # Rows with thresholds are calibrated unless they say otherwise.
    calibrated: bool | None = None
    note: str = ""


class LeakSpec(Struct, kw_only=True):
    warning_mib_per_minute: Positive
    critical_mib_per_second: Positive


class FragmentationSpec(Struct, kw_only=True):
    largest_free_share_min: Ratio
    free_blocks_per_mib_max: Positive
    smallest_free_block_min_mib: NonNeg
    act_when_free_below_mib: NonNeg
    fragmentation_ratio_max: Ratio
    consecutive_samples: Annotated[int, msgspec.Meta(ge=1)] = 3


class SystemSpec(Struct, kw_only=True):
    match: str
    memory_total_mib: Positive
    system_gib: NonNeg


class HeadroomSpec(Struct, kw_only=True):
    alpha: Share
    reserve_mib: NonNeg
    system_fraction: Share
    system: list[SystemSpec] = []


class DeriveSpec(Struct, kw_only=True):
    warning_slope: Positive
    warning_offset_mib: float
    critical_slope: Positive
    critical_offset_mib: float
    min_warning_ratio: Ratio = 0.0
    min_critical_ratio: Ratio = 0.0
    memory_tolerance: Share = 0.03
    on_critical: list[ActionSpec] = []


class TableSpec(Struct, kw_only=True):
    format: str = FORMAT
    version: str
    extends: str = ""
    description: str = ""
    leak: LeakSpec
    fragmentation: FragmentationSpec
    headroom: HeadroomSpec
    derive: DeriveSpec
    rows: list[RowSpec] = []

    def __post_init__(self) -> None:
        if self.format != FORMAT:
            raise ValueError(f"format: expected {FORMAT!r}, got {self.format!r}")
        if not self.version.strip():
            raise ValueError("version: must not be empty")
        ids = [r.id for r in self.rows]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"rows: duplicate id(s) {', '.join(dupes)}")
        for row in self.rows:
            w, c = row.warning_above_mib, row.critical_above_mib
            if (w is None) != (c is None):
                raise ValueError(
                    f"rows[id={row.id}]: give both warning_above_mib and critical_above_mib, "
                    "or neither (derived)"
                )
            if w is not None and not w < c <= row.memory_total_mib:  # type: ignore[operator]
                raise ValueError(
                    f"rows[id={row.id}]: need warning_above_mib < critical_above_mib "
                    "<= memory_total_mib"
                )
            if not row.match:
                raise ValueError(f"rows[id={row.id}].match: must name at least one pattern")
