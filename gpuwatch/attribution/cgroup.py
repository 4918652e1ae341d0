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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A pod UID: an RFC 4122 UUID, or 32 hex digits for static (manifest) pods; the systemd
# driver writes "_" where the UID has "-".
_UID = r"[0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12}"
_POD = re.compile(rf"(?:^|-)pod(?P<uid>{_UID})(?:\.slice)?$")
_QOS_IN_POD = re.compile(r"-(?P<qos>burstable|besteffort)-pod")
_ID = r"[0-9a-f]{64}"
# (pattern, runtime) for the cgroup right below the pod (or anywhere, outside Kubernetes)
_CONTAINER = (
    (re.compile(rf"^cri-containerd-(?P<id>{_ID})\.scope$"), "containerd"),
    (re.compile(rf"^crio-(?P<id>{_ID})(?:\.scope)?$"), "cri-o"),
    (re.compile(rf"^docker-(?P<id>{_ID})\.scope$"), "docker"),
    (re.compile(rf"^(?P<id>{_ID})$"), None),  # cgroupfs driver: containerd or Docker
)
_SLURM_ROOT = re.compile(r"^(?:slurm(?:_[\w.-]+)?|slurmstepd\.scope)$")
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
    fields: dict = {"path": path}
    pod_at = None
    for i, part in enumerate(parts):
        m = _POD.search(part)
        if m:
            fields["pod_uid"] = m["uid"].replace("_", "-")
            q = _QOS_IN_POD.search(part)
            parent = parts[i - 1] if i else ""
            fields["qos"] = (q["qos"] if q else parent if parent in ("burstable", "besteffort")
                             else "guaranteed")
            pod_at = i
    # the container: right below the pod, or (outside Kubernetes) any runtime scope
    candidates = parts[pod_at + 1:pod_at + 2] if pod_at is not None else parts
    for part in candidates:
        for pattern, runtime in _CONTAINER:
            m = pattern.match(part)
            if m and (runtime or pod_at is not None or _under_docker(parts, part)):
                fields["container_id"], fields["runtime"] = m["id"], runtime
                if runtime is None and pod_at is None:
                    fields["runtime"] = "docker"
                break
    _slurm(parts, fields)
    units = [p for p in parts if _UNIT.match(p)]
    if units:
        fields["systemd_unit"] = units[-1]
    return CgroupInfo(**fields)


def _expand(part: str) -> list[str]:
    """containerd's systemd driver on cgroup v1 can leave its `slice:prefix:id` triple in the
    path as one component (seen on real nodes): read it as the slice and the scope."""
    pieces = part.split(":")
    if len(pieces) == 3 and all(pieces):
        return [pieces[0], f"{pieces[1]}-{pieces[2]}.scope"]
    return [part]


def _under_docker(parts: list[str], part: str) -> bool:
    """Docker's cgroupfs driver puts a container at /docker/<id>."""
    i = parts.index(part)
    return i > 0 and parts[i - 1] == "docker"


def _slurm(parts: list[str], fields: dict) -> None:
    root = next((i for i, p in enumerate(parts) if _SLURM_ROOT.match(p)), None)
    if root is None:
        return
    for part in parts[root + 1:]:
        if m := _SLURM_UID.match(part):
            fields["slurm_uid"] = int(m["uid"])
        elif m := _SLURM_JOB.match(part):
            fields["slurm_job_id"] = m["job"]
        elif m := _SLURM_STEP.match(part):
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
