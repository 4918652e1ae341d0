"""A simulated Kubernetes node for `--simulate kubernetes`: the cgroup files and the kubelet's
pod-resources answer that such a node would give, from the scenario's pod placement. The
daemon's real cgroup parser and join run over them, so the simulation tests attribution
itself, not a shortcut around it."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from gpuwatch.attribution.podresources import ContainerDevices


@dataclass(frozen=True)
class Placement:
    namespace: str
    pod: str
    container: str
    qos: str = "guaranteed"  # guaranteed | burstable | besteffort
    # Containers of the same pod that hold no GPU (sidecars).
    sidecars: tuple[str, ...] = ()


def pod_uid(p: Placement) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"k8s://{p.namespace}/{p.pod}"))


def container_id(p: Placement, generation: int) -> str:
    """A restarted container gets a new id, as with a real runtime."""
    return hashlib.sha256(f"{p.namespace}/{p.pod}/{p.container}/{generation}".encode()
                          ).hexdigest()


def cgroup_text(p: Placement, generation: int) -> str:
    """cgroup v2, kubelet's systemd driver, containerd (the default of current
    distributions)."""
    uid = pod_uid(p).replace("-", "_")
    if p.qos == "guaranteed":
        pod_slice = f"/kubepods.slice/kubepods-pod{uid}.slice"
    else:
        pod_slice = (f"/kubepods.slice/kubepods-{p.qos}.slice/"
                     f"kubepods-{p.qos}-pod{uid}.slice")
    return f"0::{pod_slice}/cri-containerd-{container_id(p, generation)}.scope\n"


class SimulatedNode:
    """The attribution Host of a simulated node (see gpuwatch.attribution.resolver)."""

    def __init__(self, placements: dict[int, Placement], locate) -> None:
        # locate(pid) -> (slot, generation) | None; gpus() -> [(uuid, [slot, ...])]
        self.placements = placements
        self.locate = locate
        self.gpus: list[tuple[str, list[int]]] = []

    def cgroup(self, pid: int) -> str | None:
        where = self.locate(pid)
        if where is None or where[0] not in self.placements:
            return None
        return cgroup_text(self.placements[where[0]], where[1])

    def slurm_job_from_environ(self, pid: int) -> str | None:
        return None

    def owner_uid(self, pid: int) -> int | None:
        return None

    def gpu_jobs(self) -> dict[int, list[str]]:
        return {}

    def pods(self) -> None:
        return None  # the simulated node has no API server: pod-resources names pods

    def containers(self) -> list[ContainerDevices]:
        # A GPU shared by several containers (time-slicing) is listed for each of them, as
        # the client reports it once replica suffixes are removed.
        devices: dict[tuple[str, str, str], set[str]] = {}
        for gpu_uuid, slots in self.gpus:
            for s in slots:
                if (p := self.placements.get(s)) is not None:
                    devices.setdefault((p.namespace, p.pod, p.container), set()).add(gpu_uuid)
        out = [ContainerDevices(ns, pod, c, frozenset(d))
               for (ns, pod, c), d in sorted(devices.items())]
        for p in {p.pod: p for p in self.placements.values()}.values():
            out += [ContainerDevices(p.namespace, p.pod, s, frozenset()) for s in p.sidecars]
        return out
