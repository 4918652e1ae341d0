"""The threshold table: shipped data, matching, derivation, overrides, CLI, metrics."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.core import Metric

from gpuwatch.exporter.families import memory_signals
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.memory import MemoryAnalyzer
from gpuwatch.thresholds import ThresholdsError, available_versions, load_table
from gpuwatch.thresholds.cli import parse_bytes, thresholds

MIB = 1 << 20
GIB = 1 << 30
A100 = ("NVIDIA A100-SXM4-80GB", 85899345920)


@pytest.fixture(scope="module")
def table():
    return load_table()


def test_shipped_version_and_figures(table):
    assert "2.3.1" in available_versions()
    assert table.version == "2.3.1" and table.source == "builtin" and table.base == ""
    assert table.leak.warning_bytes_per_second == pytest.approx(12 * MIB / 60)
    assert table.leak.critical_bytes_per_second == 52428800  # the seed's rate() rule
    frag = table.fragmentation
    assert frag.largest_free_share_min == 0.6
    assert frag.free_blocks_per_mb_max == 0.8
    assert frag.smallest_free_block_min_bytes == 256 * MIB
    assert frag.act_when_free_below_bytes == 512 * MIB
    assert frag.fragmentation_ratio_max == 0.35
    assert frag.consecutive_samples == 3
    assert table.headroom.alpha == 0.05


def test_a100_row_is_calibrated(table):
    row = table.match(*A100)
    assert row.id == "a100-80gb" and row.calibrated and row.version == "2.3.1"
    assert row.warning_bytes == 62000 * MIB and row.critical_bytes == 73500 * MIB
    assert [(a.hook, a.kind) for a in row.on_critical] == [("snapshot", "allocator")]
    # budget = 0.95 x (80 GiB - 2.1 GiB - 512 MiB): above the red line, below the total
    assert row.system_bytes == int(2.1 * GIB)
    assert row.budget_bytes == int(0.95 * (80 * GIB - int(2.1 * GIB) - 512 * MIB))
    assert row.critical_bytes < row.budget_bytes < row.memory_total_bytes
    assert table.match("NVIDIA A100 80GB PCIe", 81920 * MIB).id == "a100-80gb"


def test_rtx_4090_row_signals_and_traces(table):
    row = table.match("NVIDIA GeForce RTX 4090", 24564 * MIB)  # NVML's total for a 4090
    assert row.id == "rtx-4090" and row.calibrated
    assert (row.warning_bytes, row.critical_bytes) == (17500 * MIB, 21800 * MIB)
    assert [(a.hook, a.signal or a.kind) for a in row.on_critical] == [
        ("signal", "SIGUSR1"), ("snapshot", "history")]


@pytest.mark.parametrize("name,total_mib", [
    ("NVIDIA H100 80GB HBM3", 81559),
    ("NVIDIA H200", 143771),
    ("NVIDIA L40S", 46068),
    ("NVIDIA A10", 23028),
    ("NVIDIA A100-SXM4-40GB", 40960),  # the A100 row is for 80 GB
])
def test_gpus_the_table_lacks_are_derived(table, name, total_mib):
    row = table.match(name, total_mib * MIB)
    assert row.id == "derived" and not row.calibrated
    assert "derived" in row.rule
    assert 0.6 * row.memory_total_bytes <= row.warning_bytes < row.critical_bytes
    assert row.critical_bytes < row.budget_bytes < row.memory_total_bytes


def test_v100_row_is_known_but_derived(table):
    row = table.match("Tesla V100-SXM2-32GB", 32768 * MIB)
    assert row.id == "v100-32gb" and not row.calibrated and "not legible" in row.note
    assert (row.warning_bytes, row.critical_bytes)[0] == table.derive(32768 * MIB)[0]


def test_h100_uses_its_own_system_overhead(table):
    assert table.match("NVIDIA H100 80GB HBM3", 81559 * MIB).system_bytes == int(2.3 * GIB)


def test_derivation_rule_reproduces_the_calibrated_rows(table):
    for total, warn, crit in ((81920, 62000, 73500), (24576, 17500, 21800)):
        w, c, _ = table.derive(total * MIB)
        assert abs(w / MIB - warn) < 1 and abs(c / MIB - crit) < 1


@given(st.integers(min_value=4 * 1024, max_value=512 * 1024))
def test_derived_zones_are_ordered_for_any_size(total_mib):
    row = load_table().match("Some Future GPU", total_mib * MIB)
    assert 0 < row.warning_bytes < row.critical_bytes <= row.memory_total_bytes
    assert row.budget_bytes < row.memory_total_bytes


def _write(tmp_path, text: str):
    path = tmp_path / "site.toml"
    path.write_text(text)
    return path


def test_override_extends_and_names_its_version(tmp_path):
    path = _write(tmp_path, """
version = "2.3.1-site.1"
extends = "2.3.1"
[leak]
warning_mib_per_minute = 20
[[rows]]
id = "a100-80gb"
warning_above_mib = 60000
[[rows]]
id = "h100-80gb"
model = "H100 (80 GB)"
match = ["H100"]
memory_total_mib = 81559
warning_above_mib = 60000
critical_above_mib = 72000
""")
    t = load_table(path)
    assert (t.version, t.base, t.source) == ("2.3.1-site.1", "2.3.1", str(path))
    assert t.leak.warning_bytes_per_second == pytest.approx(20 * MIB / 60)
    assert t.leak.critical_bytes_per_second == 50 * MIB  # kept from the base
    a100 = t.match(*A100)
    assert a100.warning_bytes == 60000 * MIB and a100.critical_bytes == 73500 * MIB
    assert a100.version == "2.3.1-site.1" and a100.calibrated
    h100 = t.match("NVIDIA H100 80GB HBM3", 81559 * MIB)
    assert h100.id == "h100-80gb" and h100.calibrated and h100.critical_bytes == 72000 * MIB
    assert t.match("NVIDIA GeForce RTX 4090", 24564 * MIB).version == "2.3.1"


@pytest.mark.parametrize("text,needle", [
    ('version = "x"\n', "extends"),
    ('extends = "2.3.1"\n', "version"),
    ('version = "2.3.1"\nextends = "2.3.1"\n', "must differ"),
    ('version = "x"\nextends = "9.9.9"\n', "9.9.9"),
    ('version = "x"\nextends = "2.3.1"\n[leak]\nwarning_mb = 3\n', "leak.warning_mb: unknown key"),
    ('version = "x"\nextends = "2.3.1"\n[leak]\nwarning_mib_per_minute = "fast"\n',
     "leak.warning_mib_per_minute"),
    ('version = "x"\nextends = "2.3.1"\n[headroom]\nalpha = 1.5\n', "headroom.alpha"),
    ('version = "x"\nextends = "2.3.1"\n[[rows]]\nid = "a100-80gb"\ncolour = 1\n',
     "rows[id=a100-80gb].colour: unknown key"),
    ('version = "x"\nextends = "2.3.1"\n[[rows]]\nid = "a100-80gb"\nwarning_above_mib = 80000\n',
     "warning_above_mib < critical_above_mib"),
    ('version = "x"\nextends = "2.3.1"\n[[rows]]\nid = "new"\nmatch = ["("]\n'
     'memory_total_mib = 1000\n', "bad pattern"),
    ('version = "x"\nextends = "2.3.1"\n[[rows]]\nid = "new"\nmatch = ["Z"]\n',
     "rows[id=new].memory_total_mib: required key missing"),
    ("version = \n", "invalid TOML"),
])
def test_bad_override_names_the_key(tmp_path, text, needle):
    with pytest.raises(ThresholdsError) as err:
        load_table(_write(tmp_path, text))
    assert needle in str(err.value)
    assert str(tmp_path / "site.toml") in str(err.value)


def test_missing_override_file(tmp_path):
    with pytest.raises(ThresholdsError, match="file not found"):
        load_table(tmp_path / "nope.toml")


def test_parse_bytes():
    assert parse_bytes("85899345920") == 85899345920
    assert parse_bytes("80GiB") == 80 * GIB
    assert parse_bytes("81920 MiB") == 81920 * MIB
    assert parse_bytes("24GB") == 24 * 10**9
    for bad in ("", "80 parsecs", "-1", "0"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_cli_prints_the_table():
    out = CliRunner().invoke(thresholds, [])
    assert out.exit_code == 0, out.output
    assert "threshold table 2.3.1" in out.output
    assert "a100-80gb" in out.output and "calibrated" in out.output
    assert "v100-32gb" in out.output and "derived" in out.output
    data = json.loads(CliRunner().invoke(thresholds, ["--json"]).output)
    assert data["version"] == "2.3.1"
    assert {r["id"]: r["kind"] for r in data["rows"]} == {
        "a100-80gb": "calibrated", "rtx-4090": "calibrated", "v100-32gb": "derived"}


def test_cli_matches_a_gpu():
    out = CliRunner().invoke(
        thresholds, ["--gpu-name", "NVIDIA H200", "--memory-total", "143771MiB", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["table"]["version"] == "2.3.1"
    assert data["row"]["kind"] == "derived" and data["row"]["calibrated"] is False
    text = CliRunner().invoke(
        thresholds, ["--gpu-name", "NVIDIA A100-SXM4-80GB", "--memory-total", "85899345920"])
    assert "calibrated (row a100-80gb), table 2.3.1" in text.output
    assert "62000 MiB" in text.output


def test_cli_errors(tmp_path):
    out = CliRunner().invoke(thresholds, ["--gpu-name", "NVIDIA H200"])
    assert out.exit_code == 2 and "--memory-total" in out.output
    out = CliRunner().invoke(thresholds, ["--memory-total", "lots"])
    assert out.exit_code == 2
    bad = _write(tmp_path, 'version = "x"\n')
    out = CliRunner().invoke(thresholds, ["--file", str(bad)])
    assert out.exit_code == 2 and "extends" in out.output


def _collect(snap) -> dict[str, Metric]:
    return {m.name: m for m in memory_signals.collect(snap)}


def test_threshold_metrics_exported():
    table = load_table()
    derived = Derived()
    tick = Tick(t=1000.0, gpus=[GpuSample(index=3, uuid="GPU-a", name=A100[0],
                                          memory_total_bytes=A100[1],
                                          memory_used_bytes=10 * GIB)])
    MemoryAnalyzer(None, table).update(tick, derived, Conditions())
    metrics = _collect(Snapshot(tick=tick, derived=derived))
    info = metrics["gpuwatch_threshold_table"].samples[0]
    assert info.name == "gpuwatch_threshold_table_info"
    assert info.labels == {"version": "2.3.1", "source": "builtin", "base": ""}
    zones = {s.labels["zone"]: s.value
             for s in metrics["gpuwatch_gpu_memory_threshold_bytes"].samples}
    assert zones == {"warning": 62000 * MIB, "critical": 73500 * MIB}
    sample = metrics["gpuwatch_gpu_memory_threshold_bytes"].samples[0]
    assert sample.labels["gpu"] == "3" and sample.labels["uuid"] == "GPU-a"
    row = metrics["gpuwatch_gpu_threshold_row"].samples[0].labels
    assert row["row"] == "a100-80gb" and row["kind"] == "calibrated"
