"""Webhook remediation that targets a pod: an alert naming namespace/pod acts on that pod's
GPU processes on this host (real aiohttp server, real hooks), within the same guardrails,
and the audit records name the pod."""

from __future__ import annotations

import copy

from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.remediation.config import WebhookConfig
from tests.test_remediation_webhook import TOKEN, Server, alert, payload, run

U0, U1 = "GPU-0000aaaa-0000-0000-0000-000000000000", "GPU-1111bbbb-0000-0000-0000-000000000000"


def _proc(pid, pod, ns="serving", container="vllm"):
    return ProcessSample(pid=pid, name="python3", create_time=1.0, used_memory_bytes=1 << 30,
                         namespace=ns, pod=pod, container=container)


def _snap() -> Snapshot:
    return Snapshot(tick=Tick(t=1.0, gpus=[
        GpuSample(index=0, uuid=U0, processes=[_proc(101, "llama-70b-7c9f")]),
        GpuSample(index=1, uuid=U1, processes=[_proc(102, "llama-70b-7c9f"),
                                               _proc(201, "embedder-5d8f9", ns="research")]),
    ]))


def _pod_alert(fingerprint, **labels):
    a = copy.deepcopy(alert(fingerprint=fingerprint, **labels))
    for key in ("uuid", "gpu", "pid", "process"):
        a["labels"].pop(key, None)
    return a


def test_an_alert_naming_a_pod_acts_on_its_gpu_processes_here(tmp_path):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), _snap()) as s:
            hit = await s.post(payload(_pod_alert("p1", namespace="serving",
                                                  pod="llama-70b-7c9f")))
            elsewhere = await s.post(payload(_pod_alert("p2", namespace="serving",
                                                        pod="not-on-this-node")))
            no_ns = await s.post(payload(_pod_alert("p3", pod="llama-70b-7c9f")))
            return hit, elsewhere, no_ns, await s.settle(), s.audit()
    hit, elsewhere, no_ns, done, records = run(go())
    assert hit[0] == 200 and sum(a.get("started", 0) for a in hit[1]["actions"]) == 2
    # both processes of the pod, not the other pod's process sharing GPU 1
    assert sorted(a.target for a in done) == [f"{U0}/pid:101", f"{U1}/pid:102"]
    assert all(a.result == "ok" and a.detail["pod"] == "llama-70b-7c9f"
               and a.detail["namespace"] == "serving" for a in done)
    started = [r for r in records if r["result"] == "started"]
    assert len(started) == 2 and all(r["detail"]["pod"] == "llama-70b-7c9f" for r in started)
    assert "has no GPU process on this host" in elsewhere[1]["ignored"][0]["reason"]
    assert elsewhere[1]["actions"] == []
    # a pod name alone is not unique across namespaces: no action
    assert no_ns[1]["actions"] == [] and "name no" in no_ns[1]["ignored"][0]["reason"]


def test_pod_targets_stay_within_the_guardrails(tmp_path):
    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), _snap(), dry_run=True) as s:
            res = await s.post(payload(_pod_alert("d", namespace="research",
                                                  pod="embedder-5d8f9")))
            return res, await s.settle()
    (status, body, _), done = run(go())
    assert status == 200 and [a["result"] for a in body["actions"]] == ["dry_run"]
    assert body["actions"][0]["target"] == f"{U1}/pid:201" and done == []
