"""Threshold table figures checked against numbers worked by hand from the spec, not from
the code's own formula, and the override rules a small change must not get past."""

from __future__ import annotations

import pytest

from gpuwatch.thresholds import ThresholdsError, load_table

MIB = 1 << 20
GIB = 1 << 30


@pytest.fixture(scope="module")
def table():
    return load_table()


# Worked by hand from the shipped [derive] figures (warning 0.776018 x total - 1571.43 MiB,
# critical 0.901576 x total - 357.14 MiB, floors 0.60 / 0.85 of total):
#   H200 143771 MiB: 109997.5 / 129263.3  (the lines)
#   8 GiB:   max(4785.7, 4915.2) = 4915.2 (floor) / max(7028.6, 6963.2) = 7028.6 (line)
#   4 GiB:   2457.6 (floor) / 3481.6 (floor)
@pytest.mark.parametrize(("name", "total_mib", "warn_mib", "crit_mib"), [
    ("NVIDIA H200", 143771, 109997.5, 129263.3),
    ("Small Card 8GB", 8192, 4915.2, 7028.6),
    ("Tiny Card 4GB", 4096, 2457.6, 3481.6),
])
def test_derived_rows_match_hand_computed_figures(table, name, total_mib, warn_mib, crit_mib):
    row = table.match(name, total_mib * MIB)
    assert row.id == "derived" and not row.calibrated
    assert row.warning_bytes / MIB == pytest.approx(warn_mib, abs=0.2)
    assert row.critical_bytes / MIB == pytest.approx(crit_mib, abs=0.2)


def test_derived_rule_sits_near_the_source_ratios(table):
    """An independent check on the fitted line: at 80 GiB and 24 GiB it must land on the
    source's own ratios (75.7 % / 89.7 % and 71.2 % / 88.7 % of total, spec §1), which the
    spec states separately from the table's MiB figures."""
    for total, warn_pct, crit_pct in ((81920, 75.7, 89.7), (24576, 71.2, 88.7)):
        w, c, _ = table.derive(total * MIB)
        assert 100 * w / (total * MIB) == pytest.approx(warn_pct, abs=0.05)
        assert 100 * c / (total * MIB) == pytest.approx(crit_pct, abs=0.05)


def test_row_match_tolerance_edges(table):
    # 3 % of 81920 MiB = 2457.6 MiB either way
    assert table.match("NVIDIA A100-SXM4-80GB", (81920 - 2457) * MIB).id == "a100-80gb"
    assert table.match("NVIDIA A100-SXM4-80GB", (81920 + 2457) * MIB).id == "a100-80gb"
    assert table.match("NVIDIA A100-SXM4-80GB", (81920 - 2458) * MIB).id == "derived"
    assert table.match("NVIDIA A100-PCIE-40GB", 40960 * MIB).id == "derived"
    # The name must match too: an 80 GB card that is not an A100.
    assert table.match("NVIDIA H100 80GB HBM3", 81920 * MIB).id == "derived"


def _override(tmp_path, text: str):
    path = tmp_path / "site.toml"
    path.write_text('version = "2.3.1-site"\nextends = "2.3.1"\n' + text)
    return load_table(path)


def test_override_row_can_declare_itself_uncalibrated(tmp_path):
    t = _override(tmp_path, '[[rows]]\nid = "a100-80gb"\ncalibrated = false\n'
                            "warning_above_mib = 61000\n")
    row = t.match("NVIDIA A100-SXM4-80GB", 81920 * MIB)
    assert not row.calibrated and row.warning_bytes == 61000 * MIB
    assert row.version == "2.3.1-site"
    # A row with explicit figures and no word on it is calibrated; the base rows stay so.
    assert t.match("NVIDIA GeForce RTX 4090", 24576 * MIB).calibrated


def test_override_headroom_system_is_tried_before_the_base(tmp_path):
    t = _override(tmp_path, '[[headroom.system]]\nmatch = "A100"\nmemory_total_mib = 81920\n'
                            "system_gib = 3.5\n")
    assert t.match("NVIDIA A100-SXM4-80GB", 81920 * MIB).system_bytes == int(3.5 * GIB)
    # Entries the override does not shadow still come from the base.
    assert t.match("NVIDIA H100 80GB HBM3", 81559 * MIB).system_bytes == int(2.3 * GIB)
    # And a GPU neither names takes the share of total.
    assert t.match("NVIDIA L40S", 46068 * MIB).system_bytes == int(0.0275 * 46068 * MIB)


def test_budget_formula_by_hand(table):
    # (1 - 0.05) x (81920 MiB - 2.1 GiB - 512 MiB)
    row = table.match("NVIDIA A100-SXM4-80GB", 81920 * MIB)
    expected = 0.95 * (81920 * MIB - 2.1 * GIB - 512 * MIB)
    assert row.budget_bytes == pytest.approx(expected, abs=1)


def test_a_mig_instance_is_judged_on_a_derived_row(table):
    row = table.match("NVIDIA A100-SXM4-80GB MIG 7g.80gb", 81920 * MIB)
    assert row.id == "derived" and not row.calibrated
    assert row.rule.startswith("MIG instance, derived from total memory")


def test_zero_memory_is_an_error(table):
    with pytest.raises(ValueError, match="must be positive"):
        table.match("NVIDIA A100-SXM4-80GB", 0)
    assert table.match("Tiny", 1).critical_bytes <= 1


def test_override_row_edges(tmp_path):
    # critical exactly at the card's total is allowed; a row without a model shows its id.
    t = _override(tmp_path, '[[rows]]\nid = "l4"\nmatch = ["L4"]\nmemory_total_mib = 23034\n'
                            "warning_above_mib = 20000\ncritical_above_mib = 23034\n")
    row = t.match("NVIDIA L4", 23034 * MIB)
    assert (row.id, row.model, row.critical_bytes) == ("l4", "l4", 23034 * MIB)
    assert [r.model for r in t.rows() if r.id == "l4"] == ["l4"]
    for warn, crit in ((20000, 23035), (20000, 20000)):  # above the total; no warning zone
        with pytest.raises(ThresholdsError, match="warning_above_mib < critical_above_mib"):
            _override(tmp_path, '[[rows]]\nid = "l4"\nmatch = ["L4"]\n'
                                f"memory_total_mib = 23034\nwarning_above_mib = {warn}\n"
                                f"critical_above_mib = {crit}\n")
