"""`gpuwatch thresholds`: print the threshold table, or the row a GPU matches."""

from __future__ import annotations

import json
import re
import sys

import click

from gpuwatch.thresholds.table import MIB, Row, ThresholdsError, ThresholdTable, load_table

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_bytes(text: str) -> int:
    """'85899345920', '80GiB', '81920 MiB', '80GB' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size (bytes, or a number with KiB/MiB/GiB/GB...)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"{text!r} must be positive")
    return value


def _mib(n: float) -> str:
    return f"{n / MIB:.0f} MiB"


def _actions(row: Row) -> str:
    parts = []
    for a in row.on_critical:
        detail = a.signal or a.kind
        parts.append(f"{a.hook}({detail})" if detail else a.hook)
    return ", ".join(parts) or "-"


def _describe_table(table: ThresholdTable) -> str:
    s = table.spec
    leak = table.leak
    frag = s.fragmentation
    head = s.headroom
    systems = ", ".join(f"{e.match} {e.system_gib:g} GiB" for e in head.system)
    lines = [
        f"threshold table {table.version}"
        + (f" (extends {table.base})" if table.base else "") + f", source {table.source}",
        f"  {s.description}" if s.description else "",
        f"leak: warning {leak.warning_bytes_per_second * 60 / MIB:g} MiB/min, "
        f"critical {leak.critical_bytes_per_second / MIB:g} MiB/s",
        f"fragmentation: largest free block >= {frag.largest_free_share_min:g} of free, "
        f"free blocks <= {frag.free_blocks_per_mib_max:g} per free MiB, smallest free block "
        f">= {frag.smallest_free_block_min_mib:g} MiB, act when free < "
        f"{frag.act_when_free_below_mib:g} MiB, compaction above "
        f"{frag.fragmentation_ratio_max:g}, {frag.consecutive_samples} consecutive samples",
        f"headroom: budget = (1 - {head.alpha:g}) x (total - system - {head.reserve_mib:g} MiB);"
        f" system {systems}{', ' if systems else ''}else {head.system_fraction:g} x total",
        "",
        f"{'ROW':<12} {'MODEL':<20} {'TOTAL':>10} {'WARNING >':>10} {'CRITICAL >':>11} "
        f"{'BUDGET':>10}  {'KIND':<10}  ON CRITICAL",
    ]
    for row in table.rows():
        lines.append(
            f"{row.id:<12} {row.model:<20} {_mib(row.memory_total_bytes):>10} "
            f"{_mib(row.warning_bytes):>10} {_mib(row.critical_bytes):>11} "
            f"{_mib(row.budget_bytes):>10}  {'calibrated' if row.calibrated else 'derived':<10}"
            f"  {_actions(row)}"
        )
    lines += ["", "GPUs no row matches: " + table.derive(80 * 1024 * MIB)[2]]
    return "\n".join(line for i, line in enumerate(lines) if line or i > 1)


def _describe_row(row: Row, name: str, table: ThresholdTable) -> str:
    kind = "calibrated" if row.calibrated else "derived"
    total = row.memory_total_bytes
    lines = [
        f"GPU {name or '(no name)'} with {_mib(total)}: {kind}"
        + (f" (row {row.id})" if row.id != "derived" else " (no row matches)")
        + f", table {row.version}, source {row.source}",
        f"  warning above  {_mib(row.warning_bytes)} ({row.warning_bytes / total:.1%} of total)",
        f"  critical above {_mib(row.critical_bytes)} ({row.critical_bytes / total:.1%} of total)",
        f"  budget         {_mib(row.budget_bytes)} (system {_mib(row.system_bytes)})",
        f"  on critical    {_actions(row)}",
        f"  how            {row.rule}",
    ]
    if row.note:
        lines.append(f"  note           {row.note}")
    leak = table.leak
    lines.append(f"  leak           warning {leak.warning_bytes_per_second * 60 / MIB:g} MiB/min, "
                 f"critical {leak.critical_bytes_per_second / MIB:g} MiB/s")
    return "\n".join(lines)


@click.command()
@click.option("--gpu-name", help="NVML device name, e.g. 'NVIDIA A100-SXM4-80GB'.")
@click.option("--memory-total", help="Total memory: bytes, or with a unit (80GiB, 81920MiB).")
@click.option("--file", "table_file", type=click.Path(dir_okay=False),
              help="An override table (names its version and the version it extends).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def thresholds(gpu_name, memory_total, table_file, as_json) -> None:
    """Print the threshold table, or the row a GPU matches (calibrated or derived)."""
    if gpu_name is not None and memory_total is None:
        raise click.UsageError("--gpu-name needs --memory-total (rows match name and memory)")
    try:
        table = load_table(table_file)
    except ThresholdsError as exc:
        click.echo(f"gpuwatch: threshold table error: {exc}", err=True)
        sys.exit(2)
    if memory_total is None:
        if as_json:
            click.echo(json.dumps(table.to_dict(), indent=2))
        else:
            click.echo(_describe_table(table))
        return
    try:
        total = parse_bytes(memory_total)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory-total") from None
    row = table.match(gpu_name or "", total)
    if as_json:
        click.echo(json.dumps({"table": table.info, "row": row.to_dict()}, indent=2))
    else:
        click.echo(_describe_row(row, gpu_name or "", table))
