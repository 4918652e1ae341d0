"""Cost of one attribution refresh: cgroup files of N GPU processes, one pod-resources List
from a real gRPC server on a unix socket, and the join (goal: well under the 60 s refresh
interval's budget, and off the event loop either way).

    python -m benchmarks.attribution_refresh [--processes 512] [--pods 8] [--gpus 8] [-o F]

Each pod has one GPU container and a sidecar; pod i holds GPU i mod --gpus, so with more pods
than GPUs they are time-sliced, and pods that share exactly the same GPUs cannot be told
apart without the Kubernetes API (`named` counts the processes the join could name).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import statistics
import tempfile
import time
import uuid
from concurrent import futures

import grpc

from benchmarks.report import emit
from gpuwatch.attribution.podresources import api_pb2, api_pb2_grpc
from gpuwatch.attribution.resolver import ProcHost, resolve


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, response) -> None:
        self.response = response

    def List(self, request, context):  # the gRPC method name
        return self.response


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=512)
    ap.add_argument("--pods", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pods, pid_gpus = [], {}
        for i in range(args.pods):
            uid = str(uuid.UUID(int=i + 1))
            gpu = f"GPU-{i % args.gpus:08d}"
            cid = hashlib.sha256(str(i).encode()).hexdigest()
            pods.append(api_pb2.PodResources(name=f"pod-{i}", namespace=f"ns-{i % 4}", containers=[
                api_pb2.ContainerResources(name="main", devices=[api_pb2.ContainerDevices(
                    resource_name="nvidia.com/gpu", device_ids=[f"{gpu}::{i}"])]),
                api_pb2.ContainerResources(name="sidecar")]))
            for k in range(args.processes // args.pods):
                pid = 1000 + i * 100 + k
                d = os.path.join(tmp, "proc", str(pid))
                os.makedirs(d)
                with open(os.path.join(d, "cgroup"), "w") as f:
                    f.write(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                            f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n")
                pid_gpus[pid] = {gpu}
        server = grpc.server(futures.ThreadPoolExecutor(2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(
            Kubelet(api_pb2.ListPodResourcesResponse(pod_resources=pods)), server)
        sock = os.path.join(tmp, "kubelet.sock")
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        host = ProcHost(os.path.join(tmp, "proc"), sock)
        times, named = [], 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            res = resolve(host, pid_gpus)
            times.append(time.perf_counter() - t0)
            named = sum(1 for a in res.attributions.values() if a.pod)
        server.stop(None)
    emit({"benchmark": "attribution_refresh", "processes": len(pid_gpus), "pods": args.pods,
          "gpus": args.gpus, "named": named, "median_seconds": statistics.median(times),
          "max_seconds": max(times), "repeat": args.repeat, "cpus": os.cpu_count(),
          "python": platform.python_version()}, args.output)


if __name__ == "__main__":
    main()
