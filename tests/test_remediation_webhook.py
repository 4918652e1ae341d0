"""POST /alertmanager on the daemon's real HTTP server: authentication, bad input, firing-only,
de-duplication, routing to hooks (a real child process receives the signal)."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys

import aiohttp
import psutil
import pytest

from gpuwatch.exporter import server
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.remediation.audit import read_records
from gpuwatch.remediation.config import (
    AllowRule,
    AuditConfig,
    RemediationConfig,
    SignalConfig,
    SnapshotConfig,
    WebhookConfig,
    WebhookRoute,
)
from gpuwatch.remediation.remediator import Remediator
from tests.helpers import eventually

TOKEN = "correct-horse-battery-staple"
UUID = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def snap_with(procs) -> Snapshot:
    gpu = GpuSample(index=0, uuid=UUID, name="NVIDIA A100-SXM4-80GB",
                    memory_total_bytes=80 * 1024**3, memory_used_bytes=70 * 1024**3,
                    processes=[ProcessSample(pid=p, name="python3", create_time=ct,
                                             used_memory_bytes=1024**3) for p, ct in procs])
    return Snapshot(tick=Tick(t=1.0, gpus=[gpu]))


def alert(status="firing", pid=4242, fingerprint="f00dfeed", starts="2026-01-01T00:00:00Z",
          name="GpuwatchProcessMemoryLeak", **labels):
    lab = {"alertname": name, "severity": "critical", "uuid": UUID, "gpu": "0",
           "pid": str(pid), "process": "python3", "instance": "host:19400", "job": "gpuwatch",
           **labels}
    return {"status": status, "labels": lab,
            "annotations": {"summary": "A process is leaking GPU memory very fast."},
            "startsAt": starts, "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus/graph", "fingerprint": fingerprint}


def payload(*alerts):
    return {"version": "4", "groupKey": "{}:{alertname=\"GpuwatchProcessMemoryLeak\"}",
            "truncatedAlerts": 0, "status": "firing", "receiver": "gpuwatch-remediation",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager", "alerts": list(alerts)}


class Server:
    """The remediator's routes served by the daemon's HTTP server on a loopback port."""

    def __init__(self, tmp_path, webhook: WebhookConfig, snap=None, **cfg) -> None:
        self.tmp_path = tmp_path
        config = RemediationConfig(
            cooldown_seconds=cfg.pop("cooldown_seconds", 0),
            snapshot=SnapshotConfig(dir=str(tmp_path / "snaps")),
            audit=AuditConfig(path=str(tmp_path / "audit.jsonl")), **cfg)
        self.rem = Remediator(config, webhook, probe_dir="", dry_run=cfg.get("dry_run", False))
        self.snap = snap

    async def __aenter__(self):
        if self.snap is not None:
            await self.rem.on_events([], self.snap)
        self.runner = server.Server(server.App(self.rem.routes()))
        await self.runner.start("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.runner.port}/alertmanager"
        self.session = aiohttp.ClientSession()
        return self

    async def post(self, body, token: str | None = TOKEN, scheme="Bearer", **kw):
        headers = kw.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"{scheme} {token}"
        if isinstance(body, dict):
            body = json.dumps(body)
        headers.setdefault("Content-Type", "application/json")
        async with self.session.post(self.url, data=body, headers=headers, **kw) as resp:
            return resp.status, await resp.json(), resp.headers

    async def settle(self):
        await self.rem.wait_idle(30)
        await asyncio.sleep(0)
        return self.rem.take_done()

    async def __aexit__(self, *exc):
        await self.session.close()
        await self.runner.close()
        await self.rem.close()

    def audit(self):
        return [r for r in read_records(self.tmp_path / "audit.jsonl") if "action" in r]


def run(coro):
    return asyncio.run(coro)


def test_disabled_without_a_token(tmp_path):
    async def go():
        async with Server(tmp_path, WebhookConfig(), snap_with([(4242, 1.0)])) as s:
            return await s.post(payload(alert()), token="")
    status, body, _ = run(go())
    assert status == 404 and "webhook.token" in body["error"]


@pytest.mark.parametrize("token,scheme", [(None, "Bearer"), ("wrong", "Bearer"),
                                          (TOKEN + "x", "Bearer"), (TOKEN, "Basic"),
                                          ("", "Bearer")])
def test_missing_or_wrong_token_is_401(tmp_path, token, scheme):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)])) as s:
            res = await s.post(payload(alert()), token=token, scheme=scheme)
            return res, await s.settle()
    (status, _, headers), done = run(go())
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert done == [] and not (tmp_path / "snaps").exists()


def test_oversized_bodies_are_413(tmp_path):
    async def chunks():
        for _ in range(10):
            yield b"x" * 1000

    async def go():
        cfg = WebhookConfig(token=TOKEN, max_body_bytes=4096)
        async with Server(tmp_path, cfg, snap_with([(4242, 1.0)])) as s:
            declared = await s.post(json.dumps(payload(*[alert()] * 50)))
            streamed = await s.post(chunks(), headers={"Content-Type": "application/json"})
            return declared, streamed
    declared, streamed = run(go())
    assert declared[0] == 413 and streamed[0] == 413


@pytest.mark.parametrize("body,status,words", [
    (b"{not json", 400, "invalid"),
    (b"\xff\xfe\x00garbage", 400, "invalid"),
    (json.dumps({"version": "4"}), 400, "alerts"),
    (json.dumps({"version": "4", "alerts": [{"labels": {}}]}), 400, "status"),
    (json.dumps({"version": "4", "alerts": "nope"}), 400, "invalid"),
    (json.dumps({**payload(alert()), "version": "3"}), 400, "version"),
    (json.dumps([1, 2, 3]), 400, "invalid"),
    # 120k levels in a field nobody reads: msgspec raises RecursionError, not a DecodeError
    ('{"version": "4", "commonLabels": ' + "[" * 120_000 + "]" * 120_000 + ', "alerts": []}',
     400, "nested"),
    (json.dumps(payload(alert(pid="\u00b2"))), 400, "ascii"),  # isdigit() but not int()
    (json.dumps(payload(alert(pid="\u0661"))), 400, "ascii"),  # int() reads it as pid 1
    (json.dumps(payload(alert(gpu="\u00b2", uuid=""))), 400, "ascii"),
    (json.dumps(payload(alert(pid="-5"))), 400, "ascii"),
    (json.dumps(payload({**alert(), "labels": {"alertname": "x", "pid": 4242}})), 400, "str"),
    (json.dumps(payload({**alert(), "annotations": ["x"]})), 400, "object"),
    (json.dumps(payload(*[alert()] * 2000)), 413, "larger"),
], ids=["not-json", "not-utf8", "no-alerts", "no-status", "alerts-not-a-list", "version-3",
        "a-list", "nested-120k-deep", "pid-superscript-two", "pid-arabic-indic-one",
        "gpu-superscript-two", "pid-negative", "label-not-a-string", "annotations-a-list",
        "oversize"])
def test_invalid_bodies_are_4xx_and_audited(tmp_path, body, status, words):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(1, 1.0)])) as s:
            res = await s.post(body, headers={"Content-Type": "application/json"})
            return res, await s.settle()
    (got, answer, _), done = run(go())
    assert got == status and words in answer["error"].lower() and done == []
    [rejected] = [r for r in read_records(tmp_path / "audit.jsonl")
                  if r.get("note") == "webhook_rejected"]
    assert rejected["status"] == status and rejected["peer"] == "127.0.0.1"
    assert words in rejected["reason"].lower()
    assert not [r for r in read_records(tmp_path / "audit.jsonl") if "action" in r]


def test_wrong_content_type_is_415(tmp_path):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)])) as s:
            return await s.post(json.dumps(payload(alert())),
                                headers={"Content-Type": "text/plain"})
    assert run(go())[0] == 415


def test_before_the_first_sample_asks_to_retry(tmp_path):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN)) as s:
            return await s.post(payload(alert()))
    status, _, headers = run(go())
    assert status == 503 and headers["Retry-After"]


def test_firing_alert_acts_resolved_and_duplicates_do_not(tmp_path):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)])) as s:
            first = await s.post(payload(alert()))
            done = await s.settle()
            again = await s.post(payload(alert()))  # Alertmanager's repeat notification
            resolved = await s.post(payload(alert(status="resolved")))
            refired = await s.post(payload(alert(starts="2026-01-01T01:00:00Z")))
            done += await s.settle()
            return first, again, resolved, refired, done, s.audit()
    first, again, resolved, refired, done, records = run(go())
    assert first[0] == 200 and first[1]["actions"] == [
        {"alertname": "GpuwatchProcessMemoryLeak", "fingerprint": "f00dfeed", "started": 1}]
    assert again[1]["ignored"][0]["reason"] == "duplicate" and again[1]["actions"] == []
    assert resolved[1]["ignored"][0]["reason"] == "status resolved"
    assert refired[1]["actions"][0]["started"] == 1  # a new firing of the same alert
    assert [(a.action, a.result, a.trigger) for a in done] == [
        ("snapshot", "ok", "alertmanager")] * 2
    assert done[0].detail["alertname"] == "GpuwatchProcessMemoryLeak"
    assert done[0].detail["fingerprint"] == "f00dfeed"
    assert done[0].target == f"{UUID}/pid:4242"
    assert [r["result"] for r in records] == ["started", "ok", "started", "ok"]
    assert len(list((tmp_path / "snaps").iterdir())) == 2


def test_alert_for_a_pid_no_longer_there_is_refused(tmp_path):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)])) as s:
            res = await s.post(payload(alert(pid=999, fingerprint="b")))
            return res
    status, body, _ = run(go())
    assert status == 200
    assert body["actions"][0]["result"] == "refused"
    assert "no longer on GPU" in body["actions"][0]["reason"]


def test_alert_for_another_hosts_gpu_is_ignored(tmp_path):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)])) as s:
            res = await s.post(payload(alert(uuid="GPU-on-another-host")))
            return res, await s.settle(), s.audit()
    (status, body, _), done, records = run(go())
    assert status == 200 and "not on this host" in body["ignored"][0]["reason"]
    assert done == [] and records == []


def test_alert_without_target_labels_is_ignored(tmp_path):
    a = alert()
    for key in ("uuid", "gpu", "pid"):
        del a["labels"][key]

    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)])) as s:
            return await s.post(payload(a))
    status, body, _ = run(go())
    assert status == 200 and "name no" in body["ignored"][0]["reason"]


def test_routes_map_alerts_to_hooks_and_signal_a_real_process(tmp_path):
    got = tmp_path / "got"
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys, time\n"
         "signal.signal(signal.SIGUSR1, lambda *a: open(sys.argv[1], 'a').write('usr1'))\n"
         "print('ready', flush=True)\ntime.sleep(60)\n", str(got), "webhook-child"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        ct = psutil.Process(child.pid).create_time()
        webhook = WebhookConfig(token=TOKEN, routes=[
            WebhookRoute(alertname="Gpuwatch.*MemoryLeak", match={"severity": "critical"},
                         actions=["signal", "snapshot"]),
        ])
        sig = SignalConfig(enabled=True, allow=[AllowRule(cmdline="webhook-child")])

        async def go():
            async with Server(tmp_path, webhook, snap_with([(child.pid, ct)]), signal=sig) as s:
                unrouted = await s.post(payload(alert(pid=child.pid, severity="warning",
                                                      fingerprint="w")))
                routed = await s.post(payload(alert(pid=child.pid, fingerprint="c")))
                return unrouted, routed, await s.settle()
        unrouted, routed, done = run(go())
        assert unrouted[1]["ignored"][0]["reason"] == "no route"
        assert routed[1]["actions"][0]["started"] == 2
        assert [(a.action, a.result) for a in done] == [("signal", "ok"), ("snapshot", "ok")]
        assert eventually(got.exists)  # the child writes what it received
        assert got.read_text() == "usr1"
    finally:
        child.kill()
        child.wait()


def test_dry_run_webhook_performs_nothing(tmp_path):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)]),
                          dry_run=True) as s:
            res = await s.post(payload(alert()))
            return res, await s.settle()
    (status, body, _), done = run(go())
    assert status == 200 and body["actions"][0]["result"] == "dry_run"
    assert done == [] and not (tmp_path / "snaps").exists()


def test_gpu_index_label_is_resolved_to_its_uuid(tmp_path):
    a = copy.deepcopy(alert(name="GpuwatchGpuMemoryZone", fingerprint="z"))
    del a["labels"]["uuid"], a["labels"]["pid"]

    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)])) as s:
            res = await s.post(payload(a))
            return res, await s.settle()
    (status, _, _), done = run(go())
    assert status == 200 and done[0].result == "ok"
    assert done[0].target == f"{UUID}/pid:4242"  # the GPU's largest process


def test_reconfigure_takes_a_new_token_and_routes_and_keeps_memory(tmp_path):
    """SIGHUP: new token and routes apply at once; alerts already acted on stay so; bad
    settings are refused whole."""
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)])) as s:
            first = await s.post(payload(alert()))
            await s.settle()
            rem = s.rem
            bad = WebhookConfig(token="new-token", routes=[WebhookRoute(actions=["signal"])])
            with pytest.raises(ValueError, match=r"remediation\.signal\.enabled"):
                rem.reconfigure(rem.config, bad)
            still_old = await s.post(payload(alert(fingerprint="other")), token=TOKEN)
            done = await s.settle()  # what started under the old settings ends under them
            new_cfg = RemediationConfig(
                cooldown_seconds=0, dry_run=True,
                snapshot=SnapshotConfig(dir=str(tmp_path / "snaps")),
                audit=AuditConfig(path=str(tmp_path / "audit2.jsonl")))
            rem.reconfigure(new_cfg, WebhookConfig(token="new-token"))
            old_token = await s.post(payload(alert(fingerprint="x")), token=TOKEN)
            repeat = await s.post(payload(alert()), token="new-token")
            fresh = await s.post(payload(alert(fingerprint="y")), token="new-token")
            after = await s.settle()
            return first, still_old, old_token, repeat, fresh, done, after
    first, still_old, old_token, repeat, fresh, done, after = run(go())
    assert first[0] == 200 and still_old[0] == 200
    assert old_token[0] == 401
    assert repeat[1]["ignored"][0]["reason"] == "duplicate"
    assert fresh[1]["actions"][0]["result"] == "dry_run"
    assert [(a.action, a.result) for a in done] == [("snapshot", "ok")]  # before the change
    assert after == []
    records = list(read_records(tmp_path / "audit2.jsonl"))
    assert records[0]["note"] == "reconfigured"
    assert [r["result"] for r in records if "action" in r] == ["dry_run"]
