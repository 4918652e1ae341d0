"""What remediation does for an event (remediation/policy.py) and when the guardrails let it
(guardrails.py), as the daemon drives them: the Remediator in dry run over real events, the
replay's planner, and a real full disk under the audit log (a child's file size limit)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from gpuwatch.remediation.config import (
    EscalationRule,
    ExecConfig,
    RemediationConfig,
    SignalConfig,
)
from gpuwatch.remediation.policy import Policy, planned_actions
from gpuwatch.thresholds.table import load_table
from tests.helpers import REPO, child_env
from tests.test_remediation_faults import FULL_DISK as FAULTS_FULL_DISK
from tests.test_remediation_remediator import ev, make, snap_of, step

EXEC = ExecConfig(enabled=True, argv=[sys.executable, "-c", "pass"])


def dry(tmp_path, events, snap=None, **cfg) -> list[tuple[str, str, str]]:
    """(action, result, plan) of what the Remediator would do, in dry run."""
    rem = make(tmp_path, dry_run=True, **cfg)

    async def go():
        out = await step(rem, events, snap or snap_of())
        await rem.close()
        return out
    return [(a.action, a.result, a.detail.get("plan", "")) for a in asyncio.run(go())]


@pytest.fixture
def table(tmp_path):
    """The shipped table, with an A100 row whose on-red action is a signal."""
    path = tmp_path / "table.toml"
    path.write_text('version = "2.3.1-site"\nextends = "2.3.1"\n\n[[rows]]\nid = "a100-80gb"\n'
                    'on_critical = [{ hook = "signal", signal = "SIGUSR1" }]\n')
    return load_table(path)


def test_a_resolved_event_plans_nothing_in_replay(table):
    """The Remediator drops resolved events before it asks the policy; the replay's planner
    asks the policy about every event, so the policy's own rule is met alone here."""
    policy = Policy(RemediationConfig(), table)
    firing, resolved = ev(), ev(state="resolved")
    actions = planned_actions(policy, [firing, resolved], snap_of())
    assert [(a.action, a.detail["plan"]) for a in actions] == [("snapshot", "default")]
    assert policy.plan(resolved, snap_of()) is None


def test_an_escalation_rule_applies_only_in_its_scope(tmp_path):
    rule = EscalationRule(signal="memory_leak", scope="gpu", actions=["exec"])
    got = dry(tmp_path, [ev(pid=4242)], exec=EXEC, escalation=[rule])
    assert got == [("snapshot", "dry_run", "default")]  # a process's leak: not the rule's
    got = dry(tmp_path / "gpu", [ev(pid=None)], exec=EXEC, escalation=[rule])
    assert [(a, p) for a, _, p in got] == [("exec", "escalation[0]")]


def test_an_escalation_rule_applies_only_at_its_severity(tmp_path):
    rule = EscalationRule(signal="memory_*", severity="critical", actions=["exec"])
    assert dry(tmp_path, [ev(severity="warning")], exec=EXEC, escalation=[rule]) == []
    got = dry(tmp_path / "crit", [ev(severity="critical")], exec=EXEC, escalation=[rule])
    assert got == [("exec", "dry_run", "escalation[0]")]


def test_an_escalation_of_less_than_a_second_is_still_a_ladder(tmp_path):
    rule = EscalationRule(signal="memory_leak", actions=["snapshot", "exec"],
                          escalate_after_seconds=0.5)
    got = dry(tmp_path, [ev()], exec=EXEC, escalation=[rule])
    assert [a for a, _, _ in got] == ["snapshot"]  # exec comes 0.5 s later, if still firing


def test_a_rows_on_red_action_is_not_taken_on_a_warning_zone(tmp_path, table):
    signal_on = SignalConfig(enabled=True)
    zone = ev(signal_="memory_zone", severity="warning", pid=None)
    assert dry(tmp_path, [zone], table=table, signal=signal_on) == []
    red = ev(signal_="memory_zone", severity="critical", pid=None)
    got = dry(tmp_path / "red", [red], table=table, signal=signal_on)
    assert [(a, p) for a, _, p in got] == [("signal", "table:a100-80gb")]


def test_table_actions_off_leaves_the_rows_actions_to_the_defaults(tmp_path, table):
    red = ev(signal_="memory_zone", severity="critical", pid=None)
    got = dry(tmp_path, [red], table=table, signal=SignalConfig(enabled=True),
              table_actions=False)
    assert [(a, p) for a, _, p in got] == [("snapshot", "default")]


# The child of tests/test_remediation_faults.py whose disk fills up under the audit log
# (RLIMIT_FSIZE at its size, SIGXFSZ ignored), with a rate limit of one action an hour: the
# refused action must give its slot back.
FULL_DISK = FAULTS_FULL_DISK.split("async def go():")[0] + """async def go():
    rem = make(tmp, clock=clock, rate_limit=1, rate_window_seconds=3600)
    rem.audit.retry_seconds = 0.05
    await rem.wait_idle(10)
    disk(full=True)
    refused = await step(rem, [ev()], snap_of())
    disk(full=False)
    clock.t += 1
    ran = await step(rem, [ev()], snap_of())
    other = await step(rem, [ev(pid=77)], snap_of(((4242, 1000.0), (77, 1001.0))))
    await rem.close()
    return {"refused": results(refused), "ran": results(ran), "other": results(other)}

print(json.dumps(asyncio.run(go())))
"""


def test_an_action_refused_on_a_full_disk_gives_its_rate_limit_slot_back(tmp_path):
    res = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True,
                         text=True, env=child_env(), cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["refused"] == [["snapshot", "refused"]]
    assert out["ran"] == [["snapshot", "ok"]]  # the one slot of the hour: not taken before
    assert out["other"] == [["snapshot", "skipped_rate_limit"]]  # ... and taken now
