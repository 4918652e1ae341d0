"""The kubelet's pod-resources API (v1 `List`) over its node-local unix socket: which
container of which pod holds which device (GPU UUIDs from the NVIDIA device plugin).

grpcio is imported only when the socket exists, so hosts without Kubernetes never load it
(it is the optional `kubernetes` extra). The generated code (api_pb2*.py) lives next to
the .proto it comes from.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a node's whole pod list; gRPC's default is 4 MiB
MAX_DEVICES = 100_000


class PodResourcesUnavailable(Exception):
    """No answer from the kubelet; the message says why (shown in /api/state)."""


@dataclass(frozen=True)
class ContainerDevices:
    namespace: str
    pod: str
    container: str
    # Device ids as the device plugins report them, time-slicing replica suffixes removed.
    devices: frozenset[str]


def normalize_device_id(device_id: str) -> str:
    """The NVIDIA device plugin's time-slicing/MPS replicas are `<uuid>::<n>`."""
    return device_id.split("::", 1)[0]


def list_containers(socket_path: str = DEFAULT_SOCKET,
                    timeout: float = 2.0) -> list[ContainerDevices]:
    """Every container the kubelet knows on this node, with its devices; raises
    PodResourcesUnavailable with the reason."""
    try:
        mode = os.stat(socket_path).st_mode
    except OSError as exc:
        raise PodResourcesUnavailable(
            f"no pod-resources socket at {socket_path} ({exc.strerror})") from None
    if not stat.S_ISSOCK(mode):
        raise PodResourcesUnavailable(f"{socket_path} is not a unix socket")
    try:
        import grpc

        from gpuwatch.attribution.podresources import api_pb2, api_pb2_grpc
    except ImportError as exc:
        raise PodResourcesUnavailable(
            f"grpcio is not installed ({exc.name}): install gpuwatch's 'kubernetes' extra"
        ) from None
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.enable_http_proxy", 0)]
    try:
        with grpc.insecure_channel(f"unix://{os.path.abspath(socket_path)}",
                                   options=options) as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)
            response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        raise PodResourcesUnavailable(
            f"pod-resources List failed: {getattr(code, 'name', code)}: {detail}") from None
    out: list[ContainerDevices] = []
    count = 0
    for pod in response.pod_resources:
        for container in pod.containers:
            ids = {normalize_device_id(d) for dev in container.devices for d in dev.device_ids}
            count += len(ids)
            if count > MAX_DEVICES:
                raise PodResourcesUnavailable("pod-resources List: too many devices")
            out.append(ContainerDevices(pod.namespace, pod.name, container.name,
                                        frozenset(ids)))
    return out
