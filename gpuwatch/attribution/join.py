"""Joins the two halves of Kubernetes attribution, purely (no I/O):

- pid -> (pod UID, container id), from the process's cgroup;
- (namespace, pod, container) -> devices, from the kubelet's pod-resources API.

pod-resources does not name pod UIDs, so the join goes through the GPUs: a pod UID whose
processes use the GPU set S belongs to a pod whose devices include S. Where several pods
qualify (a GPU shared by time-slicing), pods already matched elsewhere are ruled out, until
nothing changes; what is still ambiguous stays unnamed rather than guessed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

from gpuwatch.attribution.cgroup import CgroupInfo
from gpuwatch.attribution.podresources import ContainerDevices

if TYPE_CHECKING:  # pods come from the kubelet or the API server's client, where configured
    from gpuwatch.attribution.kubeapi import PodMeta


class Attribution(msgspec.Struct, kw_only=True):
    """What gpuwatch attributes to one process; None where unknown."""

    pid: int
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    container: str | None = None
    container_id: str | None = None
    qos: str | None = None
    slurm_job_id: str | None = None
    slurm_job_user: str | None = None
    # SLURM_JOB_ID from the process's own environment: anyone can set it, so it is shown
    # for what it is and never becomes slurm_job_id (pages are routed by it).
    slurm_job_id_self_reported: str | None = None
    systemd_unit: str | None = None
    # Allow-listed pod labels and annotations, from the kubelet or API source.
    pod_labels: dict[str, str] | None = None
    pod_annotations: dict[str, str] | None = None
    # Which sources said so, "+"-joined: cgroup, podresources, kubernetes-api, job-mapping,
    # environ-self-reported;
    # None: nothing known.
    source: str | None = None


PodKey = tuple[str, str]  # (namespace, pod)


def _match(wanted: dict, candidates_of, taken_before: frozenset = frozenset()) -> dict:
    """Unique assignment by elimination: key -> the one candidate left for it."""
    options = {k: set(candidates_of(k, gpus)) for k, gpus in wanted.items()}
    assigned: dict = {}
    changed = True
    while changed:
        changed = False
        taken = set(assigned.values()) | taken_before
        for key, opts in options.items():
            if key in assigned:
                continue
            left = opts - taken
            if len(left) == 1:
                assigned[key] = next(iter(left))
                taken.add(assigned[key])
                changed = True
    return assigned


def join(pid_gpus: dict[int, set[str]], cgroups: dict[int, CgroupInfo],
         containers: Iterable[ContainerDevices] | None,
         api_pods: Iterable[PodMeta] | None = None,
         pods_source: str = "kubernetes-api") -> dict[int, Attribution]:
    """pid_gpus: the GPU UUIDs each pid uses (empty when unknown); cgroups: what each pid's
    cgroup says; containers: pod-resources' answer (None when it is unavailable); api_pods:
    this node's pods from the kubelet or the API server (optional: they name UIDs exactly;
    pods_source says which)."""
    out = {pid: _from_cgroup(pid, cgroups.get(pid)) for pid in pid_gpus}
    named = _name_from_api(out, api_pods or (), pods_source)
    if containers is None:
        return out
    containers = list(containers)
    pods: dict[PodKey, dict[str, frozenset[str]]] = defaultdict(dict)
    for c in containers:
        pods[(c.namespace, c.pod)][c.container] = c.devices
    pod_devices = {k: frozenset().union(*v.values()) for k, v in pods.items()}

    uid_gpus: dict[str, set[str]] = defaultdict(set)
    for pid, att in out.items():
        if att.pod_uid and att.pod is None:
            uid_gpus[att.pod_uid] |= pid_gpus[pid]
    uid_pod = _match(uid_gpus, lambda _uid, gpus: (
        k for k, devs in pod_devices.items() if gpus <= devs), frozenset(named))

    # containers within each matched pod, by container id and the GPUs it uses
    cid_gpus: dict[tuple[str, str], set[str]] = defaultdict(set)
    for pid, att in out.items():
        if att.pod_uid in uid_pod and att.container_id:
            cid_gpus[(att.pod_uid, att.container_id)] |= pid_gpus[pid]
    cid_name = _match(cid_gpus, lambda key, gpus: (
        (uid_pod[key[0]], name) for name, devs in pods[uid_pod[key[0]]].items()
        if gpus <= devs))

    # GPUs held by exactly one container: a process whose cgroup cannot be read at all
    # (another PID namespace) on such a GPU belongs to it. One whose cgroup was read and
    # names no pod (a login session, a service) does not.
    holders = gpu_owners(containers)

    for pid, att in out.items():
        if att.pod_uid in uid_pod:
            att.namespace, att.pod = uid_pod[att.pod_uid]
            named = cid_name.get((att.pod_uid, att.container_id or ""))
            if named is not None:
                att.container = named[1]
            att.source = add_source(att.source, "podresources")
        elif pid not in cgroups and pid_gpus[pid]:
            owners = {h for g in pid_gpus[pid] for h in holders.get(g, ())}
            if len(owners) == 1:
                att.namespace, att.pod, att.container = next(iter(owners))
                att.source = add_source(att.source, "podresources")
    return out


def _name_from_api(out: dict[int, Attribution], pods: Iterable[PodMeta],
                   source: str) -> set[PodKey]:
    by_uid = {p.uid: p for p in pods}
    named: set[PodKey] = set()
    for att in out.values():
        meta = by_uid.get(att.pod_uid or "")
        if meta is None:
            continue
        att.namespace, att.pod = meta.namespace, meta.name
        att.container = meta.containers.get(att.container_id or "")
        att.pod_labels = dict(meta.labels) or None
        att.pod_annotations = dict(meta.annotations) or None
        att.source = add_source(att.source, source)
        named.add((meta.namespace, meta.name))
    return named


def _from_cgroup(pid: int, info: CgroupInfo | None) -> Attribution:
    att = Attribution(pid=pid)
    if info is None:
        return att
    att.pod_uid, att.container_id, att.qos = info.pod_uid, info.container_id, info.qos
    att.slurm_job_id, att.systemd_unit = info.slurm_job_id, info.systemd_unit
    if info.known or info.systemd_unit:
        att.source = "cgroup"
    return att


def add_source(source: str | None, more: str) -> str:
    return more if not source else f"{source}+{more}"


def gpu_owners(containers: Iterable[ContainerDevices]) -> dict[str, list[tuple[str, str, str]]]:
    """GPU (device id) -> [(namespace, pod, container)] holding it: attribution of a GPU
    even when none of its processes is visible (MIG, another PID namespace)."""
    out: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for c in containers:
        for d in sorted(c.devices):
            out[d].append((c.namespace, c.pod, c.container))
    return dict(out)
