"""A GPU user tries to get their process attributed to another team's pod or another user's
Slurm job, against the real daemon reading the real /proc of real processes (a fake GPU
lists them; a real gRPC pod-resources server plays the kubelet):

- in the cgroups systemd delegates to the user (user@<uid>.service), a tree named like the
  kubelet's, down to `kubepods-burstable-pod<victim's pod uid>.slice/cri-containerd-<id>.scope`;
- there too, `slurm/uid_<victim>/job_999/step_0`;
- SLURM_JOB_ID=999 in its own environment;
- a plain login-session process on a GPU that only the victim's pod holds.

Pages are routed by these labels: none of them may carry the victim's. The victim's own
process, in the cgroup the kubelet made, keeps its pod (the control)."""

from __future__ import annotations

import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.attribution.podresources import api_pb2_grpc
from tests import hostile_users as hu
from tests.helpers import wait_until
from tests.test_attribution import Kubelet

CG = hu.cgroup2_root() if hu.ROOT else None
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(CG is None, reason="needs root and a writable cgroup v2 "
                                 "hierarchy to make the attacker's and the kubelet's cgroups")]

POD_UID = "55c6c714-b240-4dec-9a45-57b61696ab6e"
VICTIM_CID = "2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6c4eb501ca132ac36"
SPOOF_CID = "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459"
KUBELET_PATH = ("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{VICTIM_CID}.scope")
MANAGER = f"user.slice/user-{hu.ATTACKER}.slice/user@{hu.ATTACKER}.service"
SESSION = f"user.slice/user-{hu.ATTACKER}.slice/session-7.scope"


@pytest.fixture
def cgroups():
    c = hu.Cgroups(CG)
    yield c
    c.close()


@pytest.fixture
def kubelet(tmp_path):
    servicer = Kubelet([("team-b", "victim-pod", [("vllm", ["GPU-fake-0"])])])
    server = grpc.server(futures.ThreadPoolExecutor(2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    path = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{path}")
    server.start()
    yield str(path)
    server.stop(None)


def labels_by_pid(text: str) -> dict[int, dict[str, str]]:
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "gpuwatch_process_gpu_memory_used_bytes":
            for s in fam.samples:
                out[int(s.labels["pid"])] = s.labels
    return out


def test_spoofed_cgroups_environments_and_sessions_get_no_other_teams_labels(
        daemon, procs, cgroups, kubelet, probe_dir, tmp_path):
    def user(cgroup: str = "", env: dict | None = None, move_to: str = "") -> int:
        """A process of the attacker, in `cgroup` (root puts it there, as systemd does),
        then moving itself to `move_to` below it."""
        p = procs.script(hu.SELF_MOVE, uid=hu.ATTACKER, stdin=subprocess.PIPE,
                         env=env)
        if cgroup:
            cgroups.move(p.pid, cgroup)
        p.stdin.write((cgroups.path(move_to) if move_to else "") + "\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "moved"
        return p.pid

    victim = procs.script(hu.SELF_MOVE, uid=hu.VICTIM, stdin=subprocess.PIPE)
    cgroups.move(victim.pid, KUBELET_PATH)  # the kubelet's (and containerd's) doing
    victim.stdin.write("\n")
    victim.stdin.flush()
    assert victim.stdout.readline().strip() == "moved"

    cgroups.make(MANAGER, owner=hu.ATTACKER)  # systemd delegates the user manager
    spoof_pod = user(MANAGER, move_to=(
        f"{MANAGER}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{POD_UID.replace('-', '_')}.slice/cri-containerd-{SPOOF_CID}.scope"))
    spoof_job = user(MANAGER, move_to=f"{MANAGER}/slurm/uid_{hu.VICTIM}/job_999/step_0")
    env_job = user(SESSION, env={"SLURM_JOB_ID": "999", "PATH": "/usr/bin:/bin"})
    session = user(SESSION)
    for pid, where in ((victim.pid, KUBELET_PATH), (spoof_pod, "kubepods-burstable-pod"),
                       (spoof_job, "/job_999/"), (session, "session-7.scope")):
        assert where in Path(f"/proc/{pid}/cgroup").read_text()

    pids = tmp_path / "gpu-pids"
    pids.write_text("".join(f"{p}\n" for p in (victim.pid, spoof_pod, spoof_job, env_job,
                                                 session)))
    d = daemon(module="tests.fake_nvml_daemon", env={"FAKE_NVML_PIDS_FILE": str(pids)},
               config_toml=f"""
[probe]
dir = "{probe_dir}"
[attribution]
podresources_socket = "{kubelet}"
min_refresh_seconds = 0
""")
    labels = wait_until(lambda: (lambda m: m if m.get(victim.pid, {}).get("pod") else None)(
        labels_by_pid(d.metrics())), 30, what="the victim's process labelled with its pod")
    assert (labels[victim.pid]["namespace"], labels[victim.pid]["pod"],
            labels[victim.pid]["container"]) == ("team-b", "victim-pod", "vllm")
    for pid, what in ((spoof_pod, "kubepods tree in user@.service"),
                      (spoof_job, "slurm tree in user@.service"),
                      (env_job, "SLURM_JOB_ID in its environment"),
                      (session, "login session on the pod's GPU")):
        got = {k: labels[pid][k] for k in ("namespace", "pod", "container", "slurm_job_id")}
        assert got == dict.fromkeys(got, ""), f"{what}: {got}"
    # the GPU-level owner still names the one pod that holds the GPU
    assert d.state()["extras"]["gpu_owners"] == {"GPU-fake-0": [["team-b", "victim-pod",
                                                                 "vllm"]]}
