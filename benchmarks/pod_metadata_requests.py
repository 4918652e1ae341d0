"""Requests per node per minute for pod metadata: the API-server source (a LIST of the node's
pods per refresh) against the kubelet source (GET /pods on the node's kubelet), each against
a real HTTPS server on loopback that counts what it is asked.

    python -m benchmarks.pod_metadata_requests [--minutes 60] [--nodes 1000] [-o F]

The daemon's attribution source runs as it does in the daemon (AttributionSource on its
thread, refresh_seconds 60, min_refresh_seconds 5), driven on a simulated clock of 2 s ticks:
two GPU processes for the whole run and a new pod's process every 10 minutes (a new process
is looked up at its first sample, which is an extra request). Requests per minute per node
times the node count is the cluster's load; the kubelet's own checks of the token
(TokenReview, cached 2 min by default) and of the RBAC (SubjectAccessReview, cached 5 min)
are named beside it, as the kubelet's defaults, not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import platform
import shutil
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path

from gpuwatch.attribution.config import KubeletConfig, KubernetesApiConfig
from gpuwatch.attribution.resolver import ProcHost
from gpuwatch.attribution.source import AttributionSource
from gpuwatch.exporter.snapshot import SourceStatus
from gpuwatch.model import GpuSample, ProcessSample

TOKEN = "benchmark-service-account-token"
TICK = 2.0
NEW_POD_EVERY = 600.0


def pod(uid: str, cid: str) -> dict:
    return {"metadata": {"namespace": "serving", "name": f"pod-{uid[:8]}", "uid": uid,
                         "labels": {"app.kubernetes.io/name": "llm"}},
            "status": {"containerStatuses": [{"name": "vllm",
                                              "containerID": f"containerd://{cid}"}]}}


def uid_of(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


def cid_of(i: int) -> str:
    return f"{i:064x}"


def serve_https(handler, cert: Path, key: Path) -> tuple[http.server.HTTPServer, str]:
    """A threading HTTPS server on a free loopback port, serving in the background."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"https://127.0.0.1:{server.server_address[1]}"


class CountingServer:
    """HTTPS on loopback: counts requests by path, answers a PodList to a bearer token."""

    def __init__(self, workdir: Path, pods: list[dict]) -> None:
        self.cert, self.key = workdir / "srv.crt", workdir / "srv.key"
        if not self.cert.exists():
            subprocess.run([shutil.which("openssl") or "openssl", "req", "-x509", "-newkey",
                            "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                            "-addext", "subjectAltName=IP:127.0.0.1", "-keyout",
                            str(self.key), "-out", str(self.cert)],
                           check=True, capture_output=True, timeout=60)
        self.counts: dict[str, int] = {}
        self.pods = pods
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # the http.server method name
                path = self.path.split("?", 1)[0]
                outer.counts[path] = outer.counts.get(path, 0) + 1
                ok = self.headers.get("Authorization") == f"Bearer {TOKEN}"
                body = json.dumps({"kind": "PodList", "items": outer.pods}).encode()
                self.send_response(200 if ok else 401)
                self.send_header("Content-Length", str(len(body) if ok else 0))
                self.end_headers()
                if ok:
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server, self.url = serve_https(Handler, self.cert, self.key)

    def total(self) -> int:
        return sum(self.counts.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def measure(source: str, minutes: float, workdir: Path) -> dict:
    """Requests each server got while one node's attribution ran `minutes` (simulated)."""
    proc = workdir / f"proc-{source}"
    pods, n_pods = [], int(minutes * 60 // NEW_POD_EVERY) + 2
    for i in range(n_pods):
        d = proc / str(1000 + i)
        d.mkdir(parents=True, exist_ok=True)
        u = uid_of(i).replace("-", "_")
        (d / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/"
            f"cri-containerd-{cid_of(i)}.scope\n")
        pods.append(pod(uid_of(i), cid_of(i)))
    kubelet, api = CountingServer(workdir, pods), CountingServer(workdir, pods)
    (workdir / "token").write_text(TOKEN)
    common = {"token_file": str(workdir / "token"), "ca_file": str(kubelet.cert),
              "pod_labels": ["app.kubernetes.io/name"]}
    if source == "kubelet":
        host = ProcHost(str(proc), "", kubelet=KubeletConfig(enabled=True, url=kubelet.url,
                                                             **common))
    else:
        host = ProcHost(str(proc), "", kube_api=KubernetesApiConfig(
            enabled=True, url=api.url, node_name="gpu-node-1", **common))
    status = SourceStatus()
    src = AttributionSource(host, status, refresh_seconds=60.0, min_refresh_seconds=5.0)

    async def run() -> None:
        t = 0.0
        while t < minutes * 60:
            live = 2 + int(t // NEW_POD_EVERY)
            gpus = [GpuSample(index=0, uuid="GPU-0", processes=[
                ProcessSample(pid=1000 + i, create_time=1.0) for i in range(live)])]
            await src.update(gpus, t)
            if src._task is not None:
                await src._task
            t += TICK

    try:
        asyncio.run(run())
    finally:
        src.close()
        kubelet.close()
        api.close()
    return {"source": source, "minutes": minutes, "kubelet_requests": kubelet.total(),
            "api_server_requests": api.total(), "paths": {**kubelet.counts, **api.counts},
            "status_reason": status.reason}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    out = {"benchmark": "pod_metadata_requests", "machine": f"{platform.node()} (2 vCPU)",
           "tick_seconds": TICK, "refresh_seconds": 60.0, "new_pod_every_seconds": NEW_POD_EVERY,
           "nodes": args.nodes, "runs": []}
    with tempfile.TemporaryDirectory() as d:
        for source in ("kubernetes_api", "kubelet"):
            r = measure(source, args.minutes, Path(d))
            per_min = {k: r[k] / args.minutes for k in ("kubelet_requests",
                                                         "api_server_requests")}
            r["per_node_per_minute"] = per_min
            r["api_server_per_second_at_nodes"] = per_min["api_server_requests"] * (
                args.nodes / 60)
            out["runs"].append(r)
    # the kubelet's webhook checks (KubeletConfiguration defaults), per node per minute
    out["kubelet_token_review_per_node_per_minute_at_most"] = 1 / 2  # cacheTTL 2m
    out["kubelet_access_review_per_node_per_minute_at_most"] = 1 / 5  # cacheAuthorizedTTL 5m
    from benchmarks.report import emit

    emit(out, args.output)


if __name__ == "__main__":
    main()
