"""End to end on loopback: `gpuwatch run --simulate leak` is scraped by a real Prometheus
running the generated alert rules; the leak alert goes to a real Alertmanager configured
from exporters/alertmanager-webhook.yml, which posts to the daemons' /alertmanager.

Two daemons share the Prometheus and the Alertmanager receiver (the example's fan-out): one
acts for real, one runs with --dry-run. In each, the simulated leaking process takes the
identity of a real child process that records the signals it receives. The real daemon
signals its child and takes its own (policy) snapshot; the dry-run daemon touches nothing.
Both say so in their audit log and in gpuwatch_remediation_actions_total."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuwatch.monitoring import rules
from gpuwatch.remediation.audit import read_records
from tests.helpers import FAST_LEAK_TOML, REPO, wait_until

pytestmark = pytest.mark.integration

ALERT = "GpuwatchProcessMemoryLeak"
CHILD = ("import signal, sys, time\n"
         "signal.signal(signal.SIGUSR1, lambda *a: open(sys.argv[1], 'a').write('usr1\\n'))\n"
         "print('ready', flush=True)\ntime.sleep(600)\n")


def rule_files(tmp_path: Path) -> list[Path]:
    """The generated rules, with every `for` shortened so the test need not wait minutes."""
    out = []
    for name, text in rules.render(rules.RuleParams(), "rules").items():
        doc = yaml.safe_load(text)
        for group in doc["groups"]:
            group["interval"] = "1s"
            for rule in group["rules"]:
                if "alert" in rule:
                    rule["for"] = "1s"
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc))
        out.append(path)
    return out


def alertmanager_config(tmp_path: Path, daemons, token: str) -> str:
    """The shipped example, pointed at these daemons, with test-sized group timings."""
    doc = yaml.safe_load((REPO / "exporters" / "alertmanager-webhook.yml").read_text())
    token_file = tmp_path / "webhook-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    route = next(r for r in doc["route"]["routes"] if r["receiver"] == "gpuwatch-remediation")
    route.update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    receiver = next(r for r in doc["receivers"] if r["name"] == "gpuwatch-remediation")
    template = receiver["webhook_configs"][0]
    receiver["webhook_configs"] = [
        {**template, "url": f"{d.url}/alertmanager",
         "http_config": {"authorization": {"type": "Bearer",
                                           "credentials_file": str(token_file)}}}
        for d in daemons
    ]
    return yaml.safe_dump(doc)


def daemon_config(work: Path, child_pid: int, marker: str) -> str:
    return f"""
simulate_pids = {{ "leaky-worker" = {child_pid} }}
events_log = "{work / 'events.jsonl'}"
{FAST_LEAK_TOML}
[remediation]
cooldown_seconds = 0

[remediation.audit]
path = "{work / 'audit.jsonl'}"

[remediation.snapshot]
dir = "{work / 'snapshots'}"

[remediation.signal]
enabled = true
allow = [{{ cmdline = "{marker}" }}]

[[webhook.routes]]
alertname = "{ALERT}"
actions = ["signal", "snapshot"]
"""


class Child:
    def __init__(self, work: Path, marker: str) -> None:
        self.got = work / "signals-received"
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(self.got), marker],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def received(self) -> list[str]:
        return self.got.read_text().split() if self.got.exists() else []

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def actions(work: Path) -> list[dict]:
    path = work / "audit.jsonl"
    return [r for r in read_records(path) if "action" in r] if path.exists() else []


def counter(prom, instance: str, **labels) -> float:
    sel = ",".join([f'instance="{instance}"'] + [f'{k}="{v}"' for k, v in labels.items()])
    res = prom.query(f"sum(gpuwatch_remediation_actions_total{{{sel}}})")
    return float(res[0]["value"][1]) if res else 0.0


def test_leak_alert_drives_the_webhook_for_real_and_in_dry_run(tmp_path, daemon, prometheus,
                                                               alertmanager):
    token = secrets.token_urlsafe(24)
    real_dir, dry_dir = tmp_path / "real", tmp_path / "dry"
    real_dir.mkdir()
    dry_dir.mkdir()
    real_child = Child(real_dir, "gpuwatch-e2e-real-child")
    dry_child = Child(dry_dir, "gpuwatch-e2e-dry-child")
    try:
        env = {"GPUWATCH_WEBHOOK_TOKEN": token}
        real = daemon("--simulate", "leak", "--seed", "1", env=env,
                      config_toml=daemon_config(real_dir, real_child.pid,
                                                "gpuwatch-e2e-real-child"))
        dry = daemon("--simulate", "leak", "--seed", "2", "--dry-run", env=env,
                     config_toml=daemon_config(dry_dir, dry_child.pid,
                                               "gpuwatch-e2e-dry-child"))
        am = alertmanager(alertmanager_config(tmp_path, [real, dry], token))
        prom = prometheus([real.address, dry.address], rule_files=rule_files(tmp_path),
                          alertmanager_url=am.url)
        prom.wait_for('up{job="gpuwatch"} == 1')
        # Both series exist, at zero, before anything happened.
        assert counter(prom, real.address, action="signal", result="ok") == 0.0

        def acted():
            real_acts = [r for r in actions(real_dir) if r.get("trigger") == "alertmanager"]
            dry_acts = [r for r in actions(dry_dir) if r.get("trigger") == "alertmanager"]
            finished = {"ok", "failed", "refused"}
            return (any(r["result"] in finished and r["action"] == "signal" for r in real_acts)
                    and any(r["action"] == "signal" for r in dry_acts))
        wait_until(acted, timeout=240, interval=1, what="both daemons to act on the alert")

        # The alert Prometheus fired names the leaking process by GPU uuid and pid.
        fired = [a for a in prom.alerts() if a["labels"]["alertname"] == ALERT]
        assert {a["labels"]["pid"] for a in fired} >= {str(real_child.pid), str(dry_child.pid)}

        # Real: the child received SIGUSR1, through Alertmanager, with identity checked.
        real_acts = actions(real_dir)
        signal_ok = [r for r in real_acts if r["action"] == "signal" and r["result"] == "ok"]
        assert signal_ok, real_acts
        assert signal_ok[0]["trigger"] == "alertmanager"
        assert signal_ok[0]["target"].endswith(f"/pid:{real_child.pid}")
        assert signal_ok[0]["detail"]["alertname"] == ALERT
        wait_until(lambda: real_child.received(), timeout=10, what="the child's SIGUSR1")
        assert real_child.received()[0] == "usr1"
        # ... and its own policy took the read-only snapshot of the leaking process.
        policy_snaps = [r for r in real_acts if r["action"] == "snapshot"
                        and r["trigger"] == "policy" and r["result"] == "ok"]
        assert policy_snaps, real_acts
        snap_files = list((real_dir / "snapshots").glob(f"gpuwatch-*-pid{real_child.pid}-*"))
        assert snap_files and json.loads(snap_files[0].read_text())["target"]["pid"] == (
            real_child.pid)
        prom.wait_for(f'gpuwatch_remediation_actions_total{{instance="{real.address}",'
                      'action="signal",result="ok"} >= 1', timeout=30)

        # Dry run: decided, recorded, not performed.
        dry_acts = actions(dry_dir)
        assert dry_acts and {r["result"] for r in dry_acts} <= {
            "dry_run", "skipped_cooldown", "skipped_rate_limit", "refused"}, dry_acts
        assert any(r["action"] == "signal" and r["result"] == "dry_run"
                   and r["trigger"] == "alertmanager" for r in dry_acts)
        assert all(r["dry_run"] for r in dry_acts)
        assert dry_child.received() == []
        assert not (dry_dir / "snapshots").exists() or not any(
            (dry_dir / "snapshots").iterdir())
        prom.wait_for(f'gpuwatch_remediation_actions_total{{instance="{dry.address}",'
                      'action="signal",result="dry_run"} >= 1', timeout=30)
        assert counter(prom, dry.address, result="ok") == 0.0

        # Each daemon acted only on the alert for its own GPU (fan-out from one receiver).
        assert all(r["target"].endswith(f"/pid:{real_child.pid}") for r in real_acts
                   if r.get("trigger") == "alertmanager")
    finally:
        real_child.stop()
        dry_child.stop()
