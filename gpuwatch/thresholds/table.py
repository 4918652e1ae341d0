"""Load the versioned threshold table and match a GPU to its row.

`load_table()` gives the shipped table; `load_table(path)` an override file merged over
the shipped version it `extends`. `ThresholdTable.match(name, total_bytes)` always answers:
a calibrated row when the GPU's name and total memory fit one, else a row derived from the
total memory by the table's documented rule (`[derive]`), marked `calibrated = False`.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from gpuwatch.thresholds.schema import ActionSpec, RowSpec, TableSpec
from gpuwatch.tomlfile import explain, read_toml

MIB = 1 << 20
GIB = 1 << 30
DEFAULT_VERSION = "2.3.1"
BUILTIN = "builtin"


class ThresholdsError(ValueError):
    """A bad threshold table; the message names the file and the key."""


@dataclass(frozen=True)
class Action:
    hook: str
    signal: str = ""
    kind: str = ""


@dataclass(frozen=True)
class Row:
    """The thresholds one GPU is judged by (bytes; zone starts are exclusive)."""

    id: str
    model: str
    calibrated: bool
    version: str  # the table version that defined the row (or derived it)
    source: str  # "builtin" or the override file
    memory_total_bytes: int
    warning_bytes: int
    critical_bytes: int
    system_bytes: int
    budget_bytes: int
    on_critical: tuple[Action, ...] = ()
    note: str = ""
    rule: str = ""  # how the thresholds were obtained

    @property
    def thresholds(self) -> dict[str, float]:
        return {
            "warning": float(self.warning_bytes),
            "critical": float(self.critical_bytes),
            "budget": float(self.budget_bytes),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "calibrated": self.calibrated,
            "kind": "calibrated" if self.calibrated else "derived",
            "version": self.version,
            "source": self.source,
            "memory_total_bytes": self.memory_total_bytes,
            "warning_above_bytes": self.warning_bytes,
            "critical_above_bytes": self.critical_bytes,
            "system_bytes": self.system_bytes,
            "budget_bytes": self.budget_bytes,
            "on_critical": [
                {k: v for k, v in vars(a).items() if v} for a in self.on_critical
            ],
            "rule": self.rule,
            "note": self.note,
        }


@dataclass(frozen=True)
class LeakThresholds:
    warning_bytes_per_second: float
    critical_bytes_per_second: float


@dataclass(frozen=True)
class FragmentationLimits:
    largest_free_share_min: float
    free_blocks_per_mb_max: float  # per MiB, as the source counts it
    smallest_free_block_min_bytes: int
    act_when_free_below_bytes: int
    fragmentation_ratio_max: float
    consecutive_samples: int


@dataclass(frozen=True)
class Headroom:
    alpha: float
    reserve_bytes: int
    system_fraction: float


@dataclass
class ThresholdTable:
    spec: TableSpec
    source: str = BUILTIN
    # the version each row id was defined in (override rows carry the override's version)
    row_versions: dict[str, str] = field(default_factory=dict)
    _cache: dict[tuple[str, int], Row] = field(default_factory=dict, repr=False)

    @property
    def version(self) -> str:
        return self.spec.version

    @property
    def base(self) -> str:
        return self.spec.extends

    @property
    def leak(self) -> LeakThresholds:
        s = self.spec.leak
        return LeakThresholds(s.warning_mib_per_minute * MIB / 60.0,
                              s.critical_mib_per_second * MIB)

    @property
    def fragmentation(self) -> FragmentationLimits:
        s = self.spec.fragmentation
        return FragmentationLimits(
            largest_free_share_min=s.largest_free_share_min,
            free_blocks_per_mb_max=s.free_blocks_per_mib_max,
            smallest_free_block_min_bytes=int(s.smallest_free_block_min_mib * MIB),
            act_when_free_below_bytes=int(s.act_when_free_below_mib * MIB),
            fragmentation_ratio_max=s.fragmentation_ratio_max,
            consecutive_samples=s.consecutive_samples,
        )

    @property
    def headroom(self) -> Headroom:
        s = self.spec.headroom
        return Headroom(s.alpha, int(s.reserve_mib * MIB), s.system_fraction)

    @property
    def info(self) -> dict[str, str]:
        return {"version": self.version, "source": self.source, "base": self.base}

    # -- matching -------------------------------------------------------------------------

    def _fits(self, patterns: list[str], row_total_mib: float, name: str, total: int) -> bool:
        tol = self.spec.derive.memory_tolerance
        if abs(total / MIB - row_total_mib) > tol * row_total_mib:
            return False
        return any(re.search(p, name, re.IGNORECASE) for p in patterns)

    def system_bytes(self, name: str, total: int) -> int:
        """V_system: the figure for this GPU where the table has one, else a share of total."""
        h = self.spec.headroom
        for entry in h.system:
            if self._fits([entry.match], entry.memory_total_mib, name, total):
                return int(entry.system_gib * GIB)
        return int(h.system_fraction * total)

    def budget_bytes(self, name: str, total: int) -> tuple[int, int]:
        """(V_system, usable budget) = (1 - alpha) * (total - V_system - V_reserve)."""
        h = self.spec.headroom
        system = self.system_bytes(name, total)
        budget = (1 - h.alpha) * (total - system - h.reserve_mib * MIB)
        return system, max(0, int(budget))

    def derive(self, total: int) -> tuple[int, int, str]:
        """Zone starts for a GPU the table lacks, from its total memory alone."""
        d = self.spec.derive
        mib = total / MIB
        warn = max(d.warning_slope * mib - d.warning_offset_mib, d.min_warning_ratio * mib)
        crit = max(d.critical_slope * mib - d.critical_offset_mib, d.min_critical_ratio * mib)
        crit = min(crit, mib)
        warn = min(warn, crit)
        rule = (
            f"derived from total memory: warning above max({d.warning_slope:g} x total - "
            f"{d.warning_offset_mib:g} MiB, {d.min_warning_ratio:g} x total), critical above "
            f"max({d.critical_slope:g} x total - {d.critical_offset_mib:g} MiB, "
            f"{d.min_critical_ratio:g} x total)"
        )
        return int(warn * MIB), int(crit * MIB), rule

    def match(self, name: str, memory_total_bytes: int) -> Row:
        key = (name or "", int(memory_total_bytes))
        row = self._cache.get(key)
        if row is None:
            row = self._cache[key] = self._match(*key)
        return row

    def _match(self, name: str, total: int) -> Row:
        if total <= 0:
            raise ValueError("memory_total_bytes must be positive")
        # A MIG instance is its own budget: calibrated rows describe whole GPUs, so even a
        # 7g profile that nearly fills its GPU is judged on a row derived from its memory.
        mig = " MIG " in name
        for spec in () if mig else self.spec.rows:
            if self._fits(spec.match, spec.memory_total_mib, name, total):
                return self._row(spec, name, total)
        system, budget = self.budget_bytes(name, total)
        warn, crit, rule = self.derive(total)
        if mig:
            rule = "MIG instance, " + rule
        return Row(
            id="derived", model=name or "unknown GPU", calibrated=False, version=self.version,
            source=self.source, memory_total_bytes=total, warning_bytes=warn,
            critical_bytes=crit, system_bytes=system, budget_bytes=budget,
            on_critical=_actions(None, self.spec.derive.on_critical),
            note=("a MIG instance is judged on its own memory" if mig
                  else "no row of the table matches this GPU"), rule=rule,
        )

    def _row(self, spec: RowSpec, name: str, total: int) -> Row:
        system, budget = self.budget_bytes(name, total)
        version = self.row_versions.get(spec.id, self.version)
        actions = _actions(spec.on_critical, self.spec.derive.on_critical)
        if spec.warning_above_mib is not None and spec.critical_above_mib is not None:
            warn, crit = int(spec.warning_above_mib * MIB), int(spec.critical_above_mib * MIB)
            calibrated = True if spec.calibrated is None else spec.calibrated
            rule = f"row {spec.id} of table {version}"
        else:
            warn, crit, rule = self.derive(total)
            calibrated = False
        return Row(
            id=spec.id, model=spec.model or spec.id, calibrated=calibrated, version=version,
            source=self.source, memory_total_bytes=total, warning_bytes=warn,
            critical_bytes=crit, system_bytes=system, budget_bytes=budget,
            on_critical=actions, note=spec.note, rule=rule,
        )

    def rows(self) -> list[Row]:
        """Every row of the table, judged at its own nominal total memory."""
        return [
            self._row(spec, spec.model or spec.id, int(spec.memory_total_mib * MIB))
            for spec in self.spec.rows
        ]

    def to_dict(self) -> dict[str, Any]:
        leak = self.leak
        frag = msgspec.to_builtins(self.spec.fragmentation)
        return {
            "version": self.version,
            "extends": self.base,
            "source": self.source,
            "description": self.spec.description,
            "leak": {
                "warning_bytes_per_second": leak.warning_bytes_per_second,
                "critical_bytes_per_second": leak.critical_bytes_per_second,
            },
            "fragmentation": frag,
            "headroom": msgspec.to_builtins(self.spec.headroom),
            "derive": msgspec.to_builtins(self.spec.derive),
            "rows": [r.to_dict() for r in self.rows()],
        }


def _actions(specs: list[ActionSpec] | None, default: list[ActionSpec]) -> tuple[Action, ...]:
    chosen = default if specs is None else specs
    return tuple(Action(a.hook, a.signal, a.kind) for a in chosen)


# -- loading ------------------------------------------------------------------------------


# The shipped tables are files beside this module (importlib.resources and the zipfile it
# brings would cost the daemon ~2 MiB of modules for the same read).
_SHIPPED = Path(__file__).parent


def available_versions() -> list[str]:
    names = [p.name for p in _SHIPPED.iterdir()
             if p.name.startswith("v") and p.name.endswith(".toml")]
    return sorted(n[1:-5] for n in names)


def _builtin_raw(version: str) -> dict[str, Any]:
    if version not in available_versions():
        raise ThresholdsError(
            f"no shipped threshold table {version!r} (shipped: {', '.join(available_versions())})"
        )
    text = (_SHIPPED / f"v{version}.toml").read_text()
    return tomllib.loads(text)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Override sections merge key by key; rows merge by id (override rows match first);
    headroom.system entries of the override are tried before the base's."""
    out = {k: v for k, v in base.items() if k not in ("rows",)}
    for key, value in over.items():
        if key == "rows":
            continue
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            merged = {**out[key], **value}
            if key == "headroom" and "system" in value:
                merged["system"] = list(value["system"]) + list(out[key].get("system", []))
            out[key] = merged
        else:
            out[key] = value
    base_rows = {r.get("id"): r for r in base.get("rows", [])}
    new_rows, touched = [], set()
    for row in over.get("rows", []):
        rid = row.get("id") if isinstance(row, dict) else None
        if rid in base_rows:
            new_rows.append({**base_rows[rid], **row})
        else:
            new_rows.append(row)
        touched.add(rid)
    out["rows"] = new_rows + [r for rid, r in base_rows.items() if rid not in touched]
    return out, {t for t in touched if isinstance(t, str)}


def _convert(raw: dict[str, Any], where: str) -> TableSpec:
    try:
        return msgspec.convert(raw, TableSpec)
    except msgspec.ValidationError as exc:
        key, reason = explain(exc)
        # rows[3] -> rows[id=...]: the merged index means nothing to the file's author
        rm = re.match(r"rows\[(\d+)\](.*)", key)
        rows = raw.get("rows", [])
        if rm and int(rm.group(1)) < len(rows) and isinstance(rows[int(rm.group(1))], dict):
            rid = rows[int(rm.group(1))].get("id", rm.group(1))
            key = f"rows[id={rid}]{rm.group(2)}"
        raise ThresholdsError(f"{where}: {key + ': ' if key else ''}{reason}") from None


def _compile_patterns(spec: TableSpec, where: str) -> None:
    for row in spec.rows:
        for pattern in row.match:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ThresholdsError(
                    f"{where}: rows[id={row.id}].match: bad pattern {pattern!r}: {exc}"
                ) from None
    for i, entry in enumerate(spec.headroom.system):
        try:
            re.compile(entry.match)
        except re.error as exc:
            raise ThresholdsError(
                f"{where}: headroom.system[{i}].match: bad pattern {entry.match!r}: {exc}"
            ) from None


def load_builtin(version: str = DEFAULT_VERSION) -> ThresholdTable:
    spec = _convert(_builtin_raw(version), f"table v{version}")
    _compile_patterns(spec, f"table v{version}")
    return ThresholdTable(spec=spec, source=BUILTIN)


def load_table(path: str | Path | None = None) -> ThresholdTable:
    """The shipped table, or an override file merged over the version it extends."""
    if not path:
        return load_builtin()
    where = str(path)
    raw = read_toml(path, ThresholdsError)
    version, base = raw.get("version"), raw.get("extends")
    if not isinstance(version, str) or not version.strip():
        raise ThresholdsError(f"{where}: version: an override names its own version")
    if not isinstance(base, str) or not base.strip():
        raise ThresholdsError(
            f"{where}: extends: an override names the table version it extends "
            f"(shipped: {', '.join(available_versions())})"
        )
    if version == base:
        raise ThresholdsError(f"{where}: version: must differ from the base it extends ({base})")
    if "rows" in raw and not isinstance(raw["rows"], list):
        raise ThresholdsError(f"{where}: rows: expected an array of tables")
    for i, row in enumerate(raw.get("rows", [])):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise ThresholdsError(f"{where}: rows[{i}].id: every row needs a string id")
    try:
        base_raw = _builtin_raw(base)
    except ThresholdsError as exc:
        raise ThresholdsError(f"{where}: extends: {exc}") from None
    merged, touched = _merge(base_raw, raw)
    spec = _convert(merged, where)
    _compile_patterns(spec, where)
    versions = {r.id: (version if r.id in touched else base) for r in spec.rows}
    return ThresholdTable(spec=spec, source=where, row_versions=versions)
