"""Pod metadata from the node's kubelet (GET /pods on its authenticated port) against a real
HTTPS server on loopback: names and allow-listed labels, failures that say why, and the
requests per node per minute that each source costs the API server (counted by the server)."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.pod_metadata_requests import measure
from gpuwatch.attribution.config import KubeletConfig
from gpuwatch.attribution.kubeapi import KubeApiUnavailable
from gpuwatch.attribution.kubelet import kubelet_url, list_pods
from gpuwatch.attribution.resolver import ProcHost, resolve
from gpuwatch.attribution.source import AttributionSource
from gpuwatch.config import ConfigError, load
from gpuwatch.exporter.families import process as process_family
from gpuwatch.exporter.snapshot import Snapshot, SourceStatus
from gpuwatch.model import Tick
from tests.test_attribution import GPU1, UID_A, UID_B, _gpus, cgroup_line, fake_proc
from tests.test_attribution_cgroup import C1, C4
from tests.test_attribution_kubeapi import TOKEN, ApiServer


@pytest.fixture
def kubelet(tmp_path):
    server = ApiServer(tmp_path)  # the kubelet's /pods answers the same PodList
    (tmp_path / "token").write_text(TOKEN + "\n")
    yield server
    server.close()


def cfg(server, tmp_path, **kw) -> KubeletConfig:
    args = {"token_file": str(tmp_path / "token"), "ca_file": str(server.cert), **kw}
    return KubeletConfig(enabled=True, url=server.url, **args)


def test_pods_from_the_kubelet_with_labels_the_patterns_allow(kubelet, tmp_path):
    pods = list_pods(cfg(kubelet, tmp_path, pod_labels=["team"],
                         pod_label_allowlist_regex=[r"app\.kubernetes\.io/.*"]))
    assert [(p.namespace, p.name) for p in pods] == [("serving", "llama-70b-7c9f"),
                                                     ("research", "embedder-5d8f9")]
    assert pods[0].labels == {"team": "infer", "app.kubernetes.io/name": "llama"}
    assert [r["path"] for r in kubelet.requests] == ["/pods"]
    assert kubelet.requests[0]["auth"] == f"Bearer {TOKEN}"
    # two pods on one GPU: named exactly, by the kubelet
    root = fake_proc(tmp_path / "proc", {1: (cgroup_line(UID_A, C1), None),
                                         2: (cgroup_line(UID_B, C4), None)})
    res = resolve(ProcHost(str(root), "", kubelet=cfg(kubelet, tmp_path)), {1: {GPU1},
                                                                             2: {GPU1}})
    a, b = res.attributions[1], res.attributions[2]
    assert (a.pod, a.container, b.pod, b.container) == ("llama-70b-7c9f", "vllm",
                                                        "embedder-5d8f9", "embed")
    assert a.source == "cgroup+kubelet"


def test_process_info_carries_the_labels_the_patterns_matched(kubelet, tmp_path):
    """Patterns alone name the label columns: those matched on this tick's processes."""
    root = fake_proc(tmp_path / "proc", {1: (cgroup_line(UID_A, C1), None),
                                         2: (cgroup_line(UID_B, C4), None)})
    patterns = {"pod_label_allowlist_regex": [r"app\.kubernetes\.io/.*", "tea."],
                "pod_annotations": ["example.com/model", "example.com/notes"]}
    host = ProcHost(str(root), "", kubelet=cfg(kubelet, tmp_path, **patterns))
    src = AttributionSource(host, SourceStatus())
    gpus = _gpus({GPU1: [1, 2]})
    asyncio.run(src.update(gpus, 1.0))
    src.close()
    config = load(None, environ={}, overrides={"attribution": {"kubelet": {
        "enabled": True, "node_address": "127.0.0.1", **patterns}}})
    fams = {m.name: m for m in process_family.collect(
        Snapshot(tick=Tick(t=1.0, gpus=gpus), config=config))}
    info = {s.labels["pod"]: s.labels for s in fams["gpuwatch_process_info"].samples}
    assert info["llama-70b-7c9f"]["label_app_kubernetes_io_name"] == "llama"
    assert info["llama-70b-7c9f"]["label_team"] == "infer"
    # the other pod has no team label: the column is there, empty
    assert info["embedder-5d8f9"]["label_team"] == ""
    assert not [k for k in info["llama-70b-7c9f"] if "secret" in k]  # "secret-ish" unmatched
    # and the annotations named, exactly; a long value is cut, others never copied
    assert info["llama-70b-7c9f"]["annotation_example_com_model"] == "llama-3-70b"
    assert info["llama-70b-7c9f"]["annotation_example_com_notes"] == "n" * 128
    assert info["embedder-5d8f9"]["annotation_example_com_model"] == ""
    assert not [k for k in info["llama-70b-7c9f"] if "last_applied" in k]


def test_kubelet_failures_say_why_and_never_show_the_token(kubelet, tmp_path):
    (tmp_path / "wrong").write_text("not-the-token")
    with pytest.raises(KubeApiUnavailable, match="kubelet answered HTTP 401") as exc:
        list_pods(cfg(kubelet, tmp_path, token_file=str(tmp_path / "wrong")))
    assert TOKEN not in str(exc.value)
    # a self-signed serving certificate is refused unless verification is turned off
    with pytest.raises(KubeApiUnavailable, match="kubelet unreachable"):
        list_pods(cfg(kubelet, tmp_path, ca_file=str(tmp_path / "none")))
    assert list_pods(cfg(kubelet, tmp_path, ca_file=str(tmp_path / "none"),
                         insecure_skip_tls_verify=True))
    assert kubelet_url("", "10.0.0.7", 10250) == "https://10.0.0.7:10250"
    assert kubelet_url("", "fd00::7", 10250) == "https://[fd00::7]:10250"
    with pytest.raises(KubeApiUnavailable, match="node_address"):
        kubelet_url("", "", 10250)


def test_kubelet_settings_are_checked():
    with pytest.raises(ConfigError, match="pod_label_allowlist_regex"):
        load(None, environ={}, overrides={"attribution": {"kubelet": {
            "pod_label_allowlist_regex": ["app(["]}}})
    with pytest.raises(ConfigError, match="pod_annotations: 'not a key'"):
        load(None, environ={}, overrides={"attribution": {"kubelet": {
            "pod_annotations": ["not a key"]}}})
    with pytest.raises(ConfigError, match="at most 16 together"):
        load(None, environ={}, overrides={"attribution": {"kubelet": {
            "pod_labels": [f"l{i}" for i in range(10)],
            "pod_annotations": [f"a{i}" for i in range(7)]}}})
    cfg = load(None, environ={"GPUWATCH_ATTRIBUTION_KUBELET_NODE_ADDRESS": "10.1.2.3",
                              "GPUWATCH_ATTRIBUTION_KUBELET_ENABLED": "true"})
    assert cfg.attribution.kubelet.enabled and cfg.attribution.kubelet.node_address == "10.1.2.3"


def test_pod_labels_from_the_kubelet_cost_the_api_server_nothing(tmp_path):
    """Ten minutes of one node's attribution, as the daemon runs it: the API source LISTs
    once a minute, the kubelet source asks the kubelet and never the API server."""
    before = measure("kubernetes_api", 10, tmp_path)
    after = measure("kubelet", 10, tmp_path)
    assert before["paths"] == {"/api/v1/pods": before["api_server_requests"]}
    assert 10 <= before["api_server_requests"] <= 12 and before["kubelet_requests"] == 0
    assert after["api_server_requests"] == 0
    assert 10 <= after["kubelet_requests"] <= 12 and after["paths"] == {
        "/pods": after["kubelet_requests"]}
