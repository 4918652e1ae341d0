"""The fixed mutants (benchmarks/mutants_fixed.py) as a gate: every one still applies to the
code as it is, and every one of the security and policy modules is killed by the tests that
cover its module. A guard whose mutant survives is a guard no test would miss."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import mutants_fixed
from benchmarks.mutation import check_fixed
from tests.helpers import REPO, child_env


def test_every_fixed_mutant_applies_to_the_code_as_it_is():
    assert check_fixed() == []
    assert len({m.name for m in mutants_fixed.FIXED}) == len(mutants_fixed.FIXED)


def test_a_snippet_that_moved_is_an_error_naming_its_mutant():
    m = mutants_fixed.by_name()["requests.copy-hardlink"]
    source = (REPO / m.path).read_text()
    with pytest.raises(mutants_fixed.SnippetError, match=r"'requests\.copy-hardlink'.*no longer"):
        mutants_fixed.apply(m, source.replace(m.old, m.old.replace("!= 1", "> 1")))
    with pytest.raises(mutants_fixed.SnippetError, match="occurs 2 times"):
        mutants_fixed.apply(m, source + "\n" + m.old)
    assert mutants_fixed.apply(m, source) != source


@pytest.mark.slow
@pytest.mark.timeout(1500)  # about 41 mutants and one unmutated run, 7-9 min on 2 cores
def test_every_fixed_mutant_of_the_security_and_policy_modules_is_killed(tmp_path):
    out = tmp_path / "fixed.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.mutation", "--set", "fixed",
                        "--group", "security", "--group", "policy", "--jobs", "2",
                        "--json", str(out)], cwd=REPO, env=child_env(), capture_output=True,
                       text=True, timeout=1440)
    assert out.exists(), r.stderr[-3000:]
    fixed = json.loads(out.read_text())["fixed"]
    survivors = [(m["name"], m["verdict"]) for m in fixed["mutants"]
                 if not m["verdict"].startswith("killed")]
    assert survivors == [], survivors
    assert r.returncode == 0, r.stderr[-3000:]
    wanted = [m for m in mutants_fixed.FIXED if m.group in ("security", "policy")]
    assert fixed["mutants"] and len(fixed["mutants"]) == len(wanted)
