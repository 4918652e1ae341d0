"""One attribution pass over a set of pids: read their cgroups (and, for Slurm, the job id
from the environment as a fallback), ask the kubelet, join. Blocking I/O: the daemon runs it
on an executor thread, on a slow interval."""

from __future__ import annotations

import functools
import os
import pwd
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpuwatch.attribution import cgroup, procfs
from gpuwatch.attribution.join import Attribution, add_source, gpu_owners, join
from gpuwatch.attribution.podresources import (
    DEFAULT_SOCKET,
    ContainerDevices,
    PodResourcesUnavailable,
    list_containers,
)
from gpuwatch.safetext import valid

# The API server's client (with json) and the HPC job-mapping reader are imported where they
# are used: only a node whose processes run in pods asks for pods, only a configured
# job-mapping directory is read.
if TYPE_CHECKING:
    from gpuwatch.attribution.kubeapi import PodMeta


class Host(Protocol):
    """Where attribution reads from: the real /proc and kubelet, or a simulation."""

    def cgroup(self, pid: int) -> str | None: ...

    def slurm_job_from_environ(self, pid: int) -> str | None: ...

    def owner_uid(self, pid: int) -> int | None: ...

    def containers(self) -> list[ContainerDevices]:
        """pod-resources' answer; raises PodResourcesUnavailable."""

    def gpu_jobs(self) -> dict[int, list[str]]:
        """GPU index -> batch jobs on it (an HPC job-mapping directory), {} when none."""

    def pods(self) -> list[PodMeta] | None:
        """This node's pods (from its kubelet, or the API server); None when not configured;
        raises KubeApiUnavailable."""


class ProcHost:
    def __init__(self, proc_root: str = "/proc", podresources_socket: str = DEFAULT_SOCKET,
                 timeout: float = 2.0, job_mapping_dir: str = "", kube_api=None,
                 kubelet=None) -> None:
        self.proc_root = proc_root
        self.socket = podresources_socket
        self.timeout = timeout
        self.job_mapping_dir = job_mapping_dir
        self.kube_api = kube_api  # a KubernetesApiConfig, or None
        self.kubelet = kubelet  # a KubeletConfig, or None; it wins over kube_api

    @classmethod
    def from_config(cls, cfg) -> ProcHost:
        a = cfg.attribution
        return cls(cfg.proc_root, a.podresources_socket, a.timeout_seconds,
                   a.hpc_job_mapping_dir, a.kubernetes_api if a.kubernetes_api.enabled else None,
                   a.kubelet if a.kubelet.enabled else None)

    def pods(self) -> list[PodMeta] | None:
        if self.kubelet is not None:
            from gpuwatch.attribution.kubelet import list_pods

            return list_pods(self.kubelet, timeout=max(self.timeout, 5.0))
        k = self.kube_api
        if k is None:
            return None
        from gpuwatch.attribution.kubeapi import default_url, list_node_pods

        return list_node_pods(k.url or default_url(), k.node_name, token_file=k.token_file,
                              ca_file=k.ca_file, allow_labels=tuple(k.pod_labels),
                              allow_annotations=tuple(k.pod_annotations),
                              timeout=max(self.timeout, 5.0))

    def gpu_jobs(self) -> dict[int, list[str]]:
        if not self.job_mapping_dir:
            return {}
        from gpuwatch.attribution.hpc import read_job_mapping

        return read_job_mapping(self.job_mapping_dir)

    def cgroup(self, pid: int) -> str | None:
        return procfs.read_cgroup(self.proc_root, pid)

    def slurm_job_from_environ(self, pid: int) -> str | None:
        # Another user's environment is readable by root only; nobody else even tries.
        if os.geteuid() != 0:
            return None
        return procfs.slurm_job_from_environ(self.proc_root, pid)

    def owner_uid(self, pid: int) -> int | None:
        return procfs.owner_uid(self.proc_root, pid)

    def containers(self) -> list[ContainerDevices]:
        if not self.socket:
            raise PodResourcesUnavailable("pod-resources disabled (no socket configured)")
        return list_containers(self.socket, self.timeout)


@functools.lru_cache(maxsize=1024)
def user_name(uid: int) -> str | None:
    try:
        return valid(pwd.getpwuid(uid).pw_name)  # /etc/passwd holds bytes
    except (KeyError, OverflowError):
        return None


@dataclass
class Resolution:
    attributions: dict[int, Attribution]
    # part -> why it had no answer ("podresources": "no pod-resources socket at ...")
    problems: dict[str, str] = field(default_factory=dict)
    # GPU (device id) -> [(namespace, pod, container)] holding it, from pod-resources
    gpu_owners: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)


def resolve(host: Host, pid_gpus: dict[int, set[str]], *, slurm_environ: bool = True,
            gpu_index: dict[str, int] | None = None) -> Resolution:
    """gpu_index (uuid -> index) lets the HPC job-mapping files, named by index, speak."""
    problems: dict[str, str] = {}
    cgroups = {}
    for pid in pid_gpus:
        text = host.cgroup(pid)
        if text is not None:
            cgroups[pid] = cgroup.parse(text)
    containers = None
    try:
        containers = host.containers()
    except PodResourcesUnavailable as exc:
        problems["podresources"] = str(exc)
    api_pods = None
    if any(c.pod_uid for c in cgroups.values()):
        from gpuwatch.attribution.kubeapi import KubeApiUnavailable

        try:
            api_pods = host.pods()
        except KubeApiUnavailable as exc:
            problems["kubelet" if getattr(host, "kubelet", None) else "kubernetes_api"] = str(exc)
    out = join(pid_gpus, cgroups, containers, api_pods,
               "kubelet" if getattr(host, "kubelet", None) else "kubernetes-api")
    by_index = host.gpu_jobs() if gpu_index else {}
    for pid, att in out.items():
        info = cgroups.get(pid)
        if att.slurm_job_id is None and att.pod_uid is None and slurm_environ:
            att.slurm_job_id_self_reported = host.slurm_job_from_environ(pid)
            if att.slurm_job_id_self_reported:
                att.source = add_source(att.source, "environ-self-reported")
        if att.slurm_job_id is None and att.pod_uid is None and by_index:
            jobs = {j for u in pid_gpus[pid] for j in by_index.get(gpu_index.get(u, -1), ())}
            if len(jobs) == 1:
                att.slurm_job_id = jobs.pop()
                att.source = add_source(att.source, "job-mapping")
        if att.slurm_job_id:
            uid = info.slurm_uid if info is not None and info.slurm_uid is not None else None
            if uid is None:
                uid = host.owner_uid(pid)
            att.slurm_job_user = user_name(uid) if uid is not None else None
    return Resolution(out, problems, gpu_owners(containers) if containers else {})
