"""From the text of /proc/<pid>/cgroup to what runs the process: a Kubernetes pod (its UID and
QoS class) and container (its runtime id), a Slurm job, or a systemd unit.

The path shapes come from the code that creates the cgroups:
- kubelet (pkg/kubelet/cm/cgroup_manager_linux.go, pod_container_manager_linux.go,
  qos_container_manager_linux.go): the pod cgroup is `pod<uid>` under `kubepods`, below
  `burstable` or `besteffort` (guaranteed pods sit directly under `kubepods`). The systemd
  driver joins the parts with "-", replaces every "-" inside a part by "_" and expands each
  prefix into a `.slice`: `kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid_with_underscores>.slice`.
- container runtimes, below the pod cgroup: with the systemd driver a scope named
  `<prefix>-<id>.scope` (containerd's CRI plugin prefix `cri-containerd`, CRI-O's `crio`,
  Docker's `docker`; runc's systemd driver builds `<prefix>-<name>.scope`); with cgroupfs the
  bare 64-hex id (containerd, Docker) or `crio-<id>` (CRI-O). CRI-O's monitor runs in
  `crio-conmon-<id>.scope`: that is conmon, not the container.
- containerd's systemd driver on cgroup v1 hosts may show the unexpanded `<slice>:<prefix>:<id>`
  triple as one path component.
- Slurm's cgroup plugins: v1 `/slurm/uid_<uid>/job_<job>/step_<step>[/task_<n>]` (the root
  may be `slurm_<node>` on multi-slurmd hosts), v2 `/system.slice/slurmstepd.scope/
  job_<job>/step_<step>/user/task_<n>`.

Input is untrusted: bounded in size by the reader, matched by anchored patterns only, and a
line that does not parse is skipped, never an error.

Users can make cgroups of their own (systemd delegates `user@<uid>.service` to them, and a
container may own its subtree), named as they like: `.../user@1000.service/kubepods-
burstable-pod<another team's uid>.slice/cri-containerd-<id>.scope`. So each shape counts only
at the root its creator uses: a pod cgroup only where every cgroup above it is one the kubelet
makes for it (its systemd slices, or `kubepods[/<qos>]`), a Slurm job only at slurmd's root
(`/slurm*/uid_/job_/step_`, `/system.slice/slurmstepd.scope/job_/step_`), a container
runtime's scope only where the runtime puts it. None of those roots is under `user.slice`, where
users make cgroups of their own: there a process is only its unit.
A path that starts with `..` (seen from a cgroup namespace) is anchored at what follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A pod UID: an RFC 4122 UUID, or 32 hex digits for static (manifest) pods; the systemd
# driver writes "_" where the UID has "-".
_UID = r"[0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12}"
_POD_SLICE = re.compile(rf"^(?P<prefix>(?:[\w]+-)*kubepods(?:-[\w]+)*)-pod(?P<uid>{_UID})\.slice$")
_POD_DIR = re.compile(rf"^pod(?P<uid>{_UID})$")
_QOS_IN_POD = re.compile(r"-(?P<qos>burstable|besteffort)-pod")
_ID = r"[0-9a-f]{64}"
# (pattern, runtime) for the cgroup right below the pod (or anywhere, outside Kubernetes)
_CONTAINER = (
    (re.compile(rf"^cri-containerd-(?P<id>{_ID})\.scope$"), "containerd"),
    (re.compile(rf"^crio-(?P<id>{_ID})(?:\.scope)?$"), "cri-o"),
    (re.compile(rf"^docker-(?P<id>{_ID})\.scope$"), "docker"),
    (re.compile(rf"^(?P<id>{_ID})$"), None),  # cgroupfs driver: containerd or Docker
)
_SLURM_V1_ROOT = re.compile(r"^slurm(?:_[\w.-]+)?$")
_SLURM_UID = re.compile(r"^uid_(?P<uid>\d{1,10})$")
_SLURM_JOB = re.compile(r"^job_(?P<job>\d{1,20})$")
_SLURM_STEP = re.compile(r"^step_(?P<step>\d{1,10}|batch|extern|interactive)$")
_UNIT = re.compile(r"^[\w@.:\\-]{1,255}\.(?:service|scope)$")
MAX_LINES = 256


@dataclass(frozen=True)
class CgroupInfo:
    pod_uid: str | None = None
    container_id: str | None = None
    runtime: str | None = None  # containerd | cri-o | docker (None: cgroupfs, not told)
    qos: str | None = None  # guaranteed | burstable | besteffort
    slurm_job_id: str | None = None
    slurm_step: str | None = None
    slurm_uid: int | None = None
    systemd_unit: str | None = None
    path: str = ""

    @property
    def known(self) -> bool:
        return bool(self.pod_uid or self.container_id or self.slurm_job_id)


def parse_path(path: str) -> CgroupInfo:
    """One cgroup path (as in /proc/<pid>/cgroup) -> what it says about the process."""
    parts = [q for p in path.strip().split("/") if p for q in _expand(p)]
    while parts and parts[0] == "..":  # relative to a cgroup namespace: anchored below
        parts.pop(0)
    fields: dict = {"path": path}
    units = [p for p in parts if _UNIT.match(p)]
    if units:
        fields["systemd_unit"] = units[-1]
    pod_at = _pod(parts, fields)
    if pod_at is not None:
        _container(parts[pod_at + 1:pod_at + 2], fields, runtime_default=None)
    elif parts[:1] == ["docker"]:  # Docker's cgroupfs driver: /docker/<id>
        _container(parts[1:2], fields, runtime_default="docker")
    else:  # a runtime's scope outside Kubernetes: /system.slice/docker-<id>.scope
        top = parts[1:2] if parts[:1] == ["system.slice"] else parts[:1]
        _container(top, fields, runtime_default=None, scopes_only=True)
    _slurm(parts, fields)
    return CgroupInfo(**fields)


def _suffix(parts: list[str], of: list[str]) -> bool:
    """parts is what is left of `of` once a leading part of it is cut off (by a cgroup
    namespace, or a v1 hierarchy mounted below the root)."""
    return len(parts) <= len(of) and parts == of[len(of) - len(parts):]


def _pod(parts: list[str], fields: dict) -> int | None:
    """Index of the pod's cgroup, the first one whose ancestors are all the kubelet's."""
    for i, part in enumerate(parts):
        if m := _POD_SLICE.match(part):
            # systemd: a-b-c.slice lives in a.slice/a-b.slice, and nowhere else
            words = m["prefix"].split("-")
            if not _suffix(parts[:i], [f"{'-'.join(words[:k])}.slice"
                                       for k in range(1, len(words) + 1)]):
                continue
            q = _QOS_IN_POD.search(part)
            qos = q["qos"] if q else "guaranteed"
        elif m := _POD_DIR.match(part):
            above = parts[:i]
            qos = above[-1] if above and above[-1] in ("burstable", "besteffort") else \
                "guaranteed"
            if not _suffix(above, ["kubepods"] + ([qos] if qos != "guaranteed" else [])):
                continue
        else:
            continue
        fields["pod_uid"], fields["qos"] = m["uid"].replace("_", "-"), qos
        return i
    return None


def _container(candidates: list[str], fields: dict, runtime_default: str | None,
               scopes_only: bool = False) -> None:
    for part in candidates:
        for pattern, runtime in _CONTAINER:
            if runtime is None and scopes_only:
                continue  # a bare 64-hex name is a container only below a pod or /docker
            m = pattern.match(part)
            if m:
                fields["container_id"] = m["id"]
                fields["runtime"] = runtime or runtime_default
                return


def _expand(part: str) -> list[str]:
    """containerd's systemd driver on cgroup v1 can leave its `slice:prefix:id` triple in the
    path as one component (seen on real nodes): read it as the slice and the scope."""
    pieces = part.split(":")
    if len(pieces) == 3 and all(pieces):
        return [pieces[0], f"{pieces[1]}-{pieces[2]}.scope"]
    return [part]


def _slurm(parts: list[str], fields: dict) -> None:
    """Only at slurmd's own roots, each component in its place: v1 `/slurm[_<node>]/uid_<u>/
    job_<j>/step_<s>`, v2 `/system.slice/slurmstepd.scope/job_<j>/step_<s>`."""
    if parts and _SLURM_V1_ROOT.match(parts[0]):
        rest = parts[1:]
        if rest and (m := _SLURM_UID.match(rest[0])):
            fields["slurm_uid"] = int(m["uid"])
            rest = rest[1:]
    elif "slurmstepd.scope" in parts[:2] and _suffix(
            parts[:parts.index("slurmstepd.scope")], ["system.slice"]):
        rest = parts[parts.index("slurmstepd.scope") + 1:]
    else:
        return
    if rest and (m := _SLURM_JOB.match(rest[0])):
        fields["slurm_job_id"] = m["job"]
        if len(rest) > 1 and (m := _SLURM_STEP.match(rest[1])):
            fields["slurm_step"] = m["step"]


def parse(text: str) -> CgroupInfo:
    """The whole /proc/<pid>/cgroup file (v1 `ID:controllers:path` lines, the v2 `0::path`
    line, or both on hybrid hosts) -> the most specific path's CgroupInfo."""
    best = CgroupInfo()
    for line in text.splitlines()[:MAX_LINES]:
        hierarchy, sep, rest = line.partition(":")
        _controllers, sep2, path = rest.partition(":")
        if not (sep and sep2 and hierarchy.isdigit() and path.startswith("/")):
            continue
        info = parse_path(path)
        if _rank(info) > _rank(best):
            best = info
    return best


def _rank(info: CgroupInfo) -> int:
    return (4 * bool(info.pod_uid) + 2 * bool(info.container_id or info.slurm_job_id)
            + bool(info.systemd_unit))
