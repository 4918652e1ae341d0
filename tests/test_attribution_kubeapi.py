"""The optional Kubernetes API source, against a real HTTPS server on loopback (certificate
made by openssl for the test) that checks the bearer token and the node field selector:
exact pod and container names, allow-listed pod labels, and failures that say why without
ever showing the token."""

from __future__ import annotations

import asyncio
import http.server
import json
import shutil
import subprocess
import threading
import urllib.parse

import pytest

from benchmarks.pod_metadata_requests import serve_https
from gpuwatch.attribution.config import KubernetesApiConfig
from gpuwatch.attribution.kubeapi import KubeApiUnavailable, list_node_pods
from gpuwatch.attribution.resolver import ProcHost, resolve
from gpuwatch.attribution.source import AttributionSource
from gpuwatch.config import load
from gpuwatch.exporter.families import process as process_family
from gpuwatch.exporter.snapshot import Snapshot, SourceStatus
from gpuwatch.model import Tick
from tests.test_attribution import (
    GPU1,
    UID_A,
    UID_B,
    _gpus,
    cgroup_line,
    fake_proc,
)
from tests.test_attribution_cgroup import C1, C4

TOKEN = "eyJhbGciOiJSUzI1NiJ9.test-token-value"
NODE = "gpu-node-07"


def pod(ns, name, uid, containers, labels, annotations=None):
    return {"metadata": {"namespace": ns, "name": name, "uid": uid, "labels": labels,
                         "annotations": annotations or {}},
            "spec": {"nodeName": NODE},
            "status": {"containerStatuses": [{"name": n, "containerID": f"containerd://{cid}"}
                                             for n, cid in containers]}}


PODS = {"kind": "PodList", "apiVersion": "v1", "items": [
    pod("serving", "llama-70b-7c9f", UID_A, [("vllm", C1)],
        {"app.kubernetes.io/name": "llama", "team": "infer", "secret-ish": "x"},
        {"example.com/model": "llama-3-70b", "example.com/notes": "n" * 300,
         "kubectl.kubernetes.io/last-applied-configuration": "{...}"}),
    pod("research", "embedder-5d8f9", UID_B, [("embed", C4)],
        {"app.kubernetes.io/name": "embedder"}),
]}


class ApiServer:
    """GET /api/v1/pods?fieldSelector=spec.nodeName=NODE with a bearer token, over TLS."""

    def __init__(self, tmp_path, body=None) -> None:
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("openssl is not installed; the README's test command installs it")
        self.cert, self.key = tmp_path / "api.crt", tmp_path / "api.key"
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(self.key), "-out", str(self.cert)],
                       check=True, capture_output=True, timeout=60)
        self.requests: list[dict] = []
        self.body = json.dumps(PODS).encode() if body is None else body
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # the http.server method name
                url = urllib.parse.urlsplit(self.path)
                outer.requests.append({"path": url.path, "query": urllib.parse.parse_qs(
                    url.query), "auth": self.headers.get("Authorization")})
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args):
                pass

        self.server, self.url = serve_https(Handler, self.cert, self.key)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(tmp_path):
    server = ApiServer(tmp_path)
    (tmp_path / "token").write_text(TOKEN + "\n")
    yield server
    server.close()


def _cfg(api, tmp_path, **kw) -> KubernetesApiConfig:
    args = {"token_file": str(tmp_path / "token"), "ca_file": str(api.cert), **kw}
    return KubernetesApiConfig(enabled=True, url=api.url, node_name=NODE, **args)


def test_pods_of_this_node_over_tls_with_the_token(api, tmp_path):
    pods = list_node_pods(api.url, NODE, token_file=str(tmp_path / "token"),
                          ca_file=str(api.cert), allow_labels=("app.kubernetes.io/name",),
                          allow_annotations=("example.com/model",))
    assert [(p.namespace, p.name, p.uid) for p in pods] == [
        ("serving", "llama-70b-7c9f", UID_A), ("research", "embedder-5d8f9", UID_B)]
    assert pods[0].containers == {C1: "vllm"}
    assert pods[0].labels == {"app.kubernetes.io/name": "llama"}  # the allow-list only
    assert pods[0].annotations == {"example.com/model": "llama-3-70b"}
    assert pods[1].annotations == {}
    (req,) = api.requests
    assert req["path"] == "/api/v1/pods"
    assert req["query"] == {"fieldSelector": [f"spec.nodeName={NODE}"]}


def test_the_api_names_pods_the_gpus_cannot_tell_apart(api, tmp_path):
    # both pods only on the shared GPU: pod-resources alone leaves them unnamed
    root = fake_proc(tmp_path / "proc", {1: (cgroup_line(UID_A, C1), None),
                                         2: (cgroup_line(UID_B, C4), None)})
    cfg = _cfg(api, tmp_path, pod_labels=["app.kubernetes.io/name"])
    host = ProcHost(str(root), "", kube_api=cfg)
    res = resolve(host, {1: {GPU1}, 2: {GPU1}})
    a, b = res.attributions[1], res.attributions[2]
    assert (a.namespace, a.pod, a.container) == ("serving", "llama-70b-7c9f", "vllm")
    assert (b.namespace, b.pod, b.container) == ("research", "embedder-5d8f9", "embed")
    assert a.source == "cgroup+kubernetes-api"
    assert a.pod_labels == {"app.kubernetes.io/name": "llama"}
    # and gpuwatch_process_info carries the allow-listed label, kube-state-metrics style
    config = load(None, environ={}, overrides={"attribution": {"kubernetes_api": {
        "enabled": True, "node_name": NODE, "pod_labels": ["app.kubernetes.io/name"]}}})
    src = AttributionSource(host, SourceStatus())
    gpus = _gpus({GPU1: [1, 2]})
    asyncio.run(src.update(gpus, 1.0))
    src.close()
    fams = {m.name: m for m in process_family.collect(
        Snapshot(tick=Tick(t=1.0, gpus=gpus), config=config))}
    info = {s.labels["pod"]: s.labels for s in fams["gpuwatch_process_info"].samples}
    assert info["llama-70b-7c9f"]["label_app_kubernetes_io_name"] == "llama"
    assert info["embedder-5d8f9"]["label_app_kubernetes_io_name"] == "embedder"
    assert "label_team" not in info["llama-70b-7c9f"]


def test_failures_say_why_and_never_show_the_token(api, tmp_path):
    (tmp_path / "wrong").write_text("not-the-token")
    cases = [
        (dict(token_file=str(tmp_path / "wrong")), "HTTP 401"),
        (dict(token_file=str(tmp_path / "missing")), "no service-account token"),
        (dict(ca_file=str(tmp_path / "missing-ca")), "unreachable"),  # system CAs: untrusted
    ]
    for kw, words in cases:
        args = {"token_file": str(tmp_path / "token"), "ca_file": str(api.cert), **kw}
        with pytest.raises(KubeApiUnavailable, match=words) as exc:
            list_node_pods(api.url, NODE, **args)
        assert TOKEN not in str(exc.value)
    with pytest.raises(KubeApiUnavailable, match="node_name"):
        list_node_pods(api.url, "", token_file=str(tmp_path / "token"))
    with pytest.raises(KubeApiUnavailable, match="not http"):
        list_node_pods("file:///etc/passwd", NODE)
    # in the daemon: the cgroup part still works, and the status says why
    root = fake_proc(tmp_path / "proc", {1: (cgroup_line(UID_A, C1), None)})
    bad = _cfg(api, tmp_path, token_file=str(tmp_path / "wrong"))
    status = SourceStatus()
    src = AttributionSource(ProcHost(str(root), "", kube_api=bad), status)
    gpus = _gpus({GPU1: [1]})
    asyncio.run(src.update(gpus, 1.0))
    src.close()
    assert status.up and "kubernetes_api: API server answered HTTP 401" in status.reason
    assert src.cache[(1, 1.0)].pod_uid == UID_A and gpus[0].processes[0].pod == ""


def test_the_token_never_travels_over_plain_http(tmp_path):
    """kubectl-proxy style: http on loopback, no token sent."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the http.server method name
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(PODS).encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "token").write_text(TOKEN)
    try:
        pods = list_node_pods(f"http://127.0.0.1:{server.server_address[1]}", NODE,
                              token_file=str(tmp_path / "token"))
    finally:
        server.shutdown()
        server.server_close()
    assert len(pods) == 2 and seen == [None]


def test_oversized_or_malformed_answers_are_refused(tmp_path, monkeypatch):
    from gpuwatch.attribution import kubeapi

    (tmp_path / "token").write_text(TOKEN)
    for body, words in ((b"x" * 5000, "larger than"), (b"{not json", "unexpected pod list"),
                        (b'{"items": [{"metadata": 5}]}', "unexpected pod list")):
        server = ApiServer(tmp_path, body=body)
        monkeypatch.setattr(kubeapi, "MAX_RESPONSE_BYTES", 4096)
        try:
            with pytest.raises(KubeApiUnavailable, match=words):
                list_node_pods(server.url, NODE, token_file=str(tmp_path / "token"),
                               ca_file=str(server.cert))
        finally:
            server.close()
