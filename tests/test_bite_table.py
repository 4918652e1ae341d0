"""The threshold table's matching and derivation (thresholds/table.py) at the edges a site's
override file can reach: the tolerance boundary where it is exact, patterns in another case,
and derivation rules whose lines run past the total or cross each other."""

from __future__ import annotations

import pytest

from gpuwatch.thresholds.table import load_table

MIB, GIB = 1 << 20, 1 << 30


def override(tmp_path, text: str):
    path = tmp_path / "site.toml"
    path.write_text('version = "2.3.1-site"\nextends = "2.3.1"\n' + text)
    return load_table(path)


EDGE_ROW = """
[derive]
memory_tolerance = 0.125

[[rows]]
id = "edge-16g"
match = ["Edge 16G"]
memory_total_mib = 16384
warning_above_mib = 12000
critical_above_mib = 14000
"""


def test_a_gpu_exactly_at_the_tolerance_matches_its_row(tmp_path):
    """1/8 of 16384 MiB is 2048 MiB exactly: the edges are in the row, a byte past them is
    not ("within this share of the row's total")."""
    table = override(tmp_path, EDGE_ROW)
    for mib in (16384 - 2048, 16384 + 2048):
        assert table.match("Edge 16G", mib * MIB).id == "edge-16g", mib
    assert table.match("Edge 16G", (16384 - 2048) * MIB - 1).id == "derived"
    assert table.match("Edge 16G", (16384 + 2048) * MIB + 1).id == "derived"


def test_patterns_match_whatever_the_case(tmp_path):
    """A site writes its patterns in lower case; NVML names are mixed case."""
    table = override(tmp_path, '[[rows]]\nid = "h200"\nmatch = ["h200"]\n'
                               'memory_total_mib = 143771\nwarning_above_mib = 110000\n'
                               'critical_above_mib = 130000\n')
    row = table.match("NVIDIA H200", 143771 * MIB)
    assert (row.id, row.calibrated, row.critical_bytes) == ("h200", True, 130000 * MIB)
    shipped = load_table()
    assert shipped.match("nvidia a100-sxm4-80gb", 81920 * MIB).id == "a100-80gb"


# Rules a site may write (slopes are positive, offsets any number): lines that climb past
# the total on small cards, and a warning line steeper than the critical one.
RULES = {
    "critical above the total": "critical_slope = 0.9\ncritical_offset_mib = -4096\n",
    "warning steeper than critical": ("warning_slope = 0.95\nwarning_offset_mib = 0\n"
                                      "critical_slope = 0.8\ncritical_offset_mib = 0\n"),
    "both past the total": ("warning_slope = 1.2\nwarning_offset_mib = 0\n"
                            "critical_slope = 1.1\ncritical_offset_mib = 0\n"),
    "ratios at one": "min_warning_ratio = 1.0\nmin_critical_ratio = 1.0\n",
}


@pytest.mark.parametrize("rule", list(RULES))
def test_derived_zone_starts_stay_in_order_within_the_total(tmp_path, rule):
    table = override(tmp_path, "[derive]\n" + RULES[rule])
    for gib in (1, 4, 8, 12, 16, 24, 40, 48, 94, 141, 192):
        row = table.match("Some New GPU", gib * GIB)
        assert row.id == "derived"
        assert row.warning_bytes <= row.critical_bytes <= row.memory_total_bytes, (gib, row)


def test_the_table_lists_a_row_with_the_system_figure_of_its_model(tmp_path):
    """A site row named for its rack, its model an H100: listed (`gpuwatch thresholds`),
    it has the H100's V_system of the shipped headroom (2.3 GiB), as a GPU it matches has."""
    table = override(tmp_path, '[[rows]]\nid = "rack-7"\nmodel = "NVIDIA H100 80GB HBM3"\n'
                               'match = ["H100 80GB"]\nmemory_total_mib = 81920\n'
                               'warning_above_mib = 70000\ncritical_above_mib = 76000\n')
    [listed] = [r for r in table.rows() if r.id == "rack-7"]
    live = table.match("NVIDIA H100 80GB HBM3", 81920 * MIB)
    assert listed.system_bytes == live.system_bytes == int(2.3 * GIB)
    assert listed.budget_bytes == live.budget_bytes
