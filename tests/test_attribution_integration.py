"""A simulated Kubernetes node (`--simulate kubernetes`: pods of two namespaces, a GPU shared
by two pods, a leaking pod) scraped by a real Prometheus with the generated rules: every
process series names its pod, and so do the leak alert and the daemon's events."""

from __future__ import annotations

import json

import pytest

from tests.helpers import REPO, wait_until
from tests.test_monitoring_integration import FAST_LIFECYCLE, _rule_files

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXPECTED = {  # process -> (namespace, pod, container)
    "vllm": ("serving", "llama-70b-7c9f", "vllm"),
    "embedder": ("research", "embedder-5d8f9", "embed"),
    "tokenizer-svc": ("research", "tokenizer-6b7d4", "worker"),
}


def test_every_process_series_event_and_alert_names_its_pod(daemon, prometheus, tmp_path):
    events_log = tmp_path / "events.jsonl"
    d = daemon("--simulate", "kubernetes", "--events-log", str(events_log),
               config_toml=FAST_LIFECYCLE)
    prom = prometheus([d.address], rule_files=_rule_files(tmp_path, pending="5s"))
    prom.wait_for('up{job="gpuwatch"} == 1', timeout=30)

    def leak_alert():
        return [a for a in prom.alerts() if a["state"] == "firing"
                and a["labels"]["alertname"] == "GpuwatchProcessMemoryLeak"]

    alerts = wait_until(leak_alert, 200, interval=2, what="the process leak alert")
    labels = alerts[0]["labels"]
    assert (labels["namespace"], labels["pod"], labels["container"]) == EXPECTED["tokenizer-svc"]
    assert ("pod tokenizer-6b7d4 in namespace research, container worker"
            in alerts[0]["annotations"]["description"])

    # every series of every process family, over the whole run, carries the owner
    series = prom.api("series", **{"match[]": '{__name__=~"gpuwatch_process_.+"}',
                                    "start": "0"})
    families = {s["__name__"] for s in series}
    assert {"gpuwatch_process_gpu_memory_used_bytes", "gpuwatch_process_info",
            "gpuwatch_process_memory_leak_rate_bytes_per_second"} <= families
    for s in series:
        assert all(s.get(k) for k in ("namespace", "pod", "container")), s
        assert (s["namespace"], s["pod"], s["container"]) == EXPECTED[s["process"]], s
    # two namespaces, and the shared GPU 1 carries two pods
    assert {s["namespace"] for s in series} == {"serving", "research"}
    assert {s["pod"] for s in series if s["gpu"] == "1"} == {"llama-70b-7c9f",
                                                            "embedder-5d8f9"}

    # who holds each GPU, from pod-resources: GPU 1 is shared by two pods
    owners = prom.query(f'gpuwatch_gpu_owner_info{{instance="{d.address}",gpu="1"}}')
    assert {r["metric"]["pod"] for r in owners} == {"llama-70b-7c9f", "embedder-5d8f9"}

    # the Workloads dashboard's per-pod panels, with the namespace variable set
    dash = json.loads((REPO / "dashboards" / "gpuwatch-workloads.json").read_text())
    per_pod = next(p for p in dash["panels"] if p["title"] == "GPU memory per pod")
    expr = (per_pod["targets"][0]["expr"].replace("$job", "gpuwatch")
            .replace("$instance", d.address).replace("$namespace", "research")
            .replace("$pod", ".*"))
    pods = {r["metric"]["pod"]: float(r["value"][1]) for r in prom.query(expr)}
    assert set(pods) == {"embedder-5d8f9", "tokenizer-6b7d4"} and min(pods.values()) > 0

    # the daemon's own events name the pod too (log and /api/state)
    state = d.state()
    assert state["sources"]["attribution"]["up"] is True
    procs = [p for g in state["sample"]["gpus"] for p in g["processes"]]
    assert len(procs) == 4
    assert all((p["namespace"], p["pod"], p["container"]) == EXPECTED[p["name"]] for p in procs)
    leak_events = [e for e in state["recent_events"] if e.get("signal") == "memory_leak"
                   and e.get("pid") is not None]
    assert leak_events and all(e["pod"] == "tokenizer-6b7d4" and e["namespace"] == "research"
                               for e in leak_events)
    logged = [json.loads(line) for line in events_log.read_text().splitlines()]
    assert any(e.get("pod") == "tokenizer-6b7d4" for e in logged)
    # process events, and GPU events of a GPU that one pod owns, name it
    uuid2 = next(g["uuid"] for g in state["sample"]["gpus"] if g["index"] == 2)
    about = [e for e in logged if e.get("pid") is not None or e.get("gpu_uuid") == uuid2]
    assert any(e.get("pid") is None for e in about)
    assert all(e.get("pod") for e in about), about
