"""/proc/<pid>/cgroup -> pod UID, container id, QoS, Slurm job, systemd unit, over real-world
samples. Each sample names where it was seen; v1 files are cut to a few of their lines."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.attribution import cgroup

C1 = "2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6c4eb501ca132ac36"
C2 = "2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5"
C3 = "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459"
C4 = "5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c"
C5 = "d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98"
C6 = "a09bc17f5aa29b0dbdec9ede5f46cf1396d2405917ab02e6f1eb1019f388396e"
C7 = "a684bbdd0c4b6937b5ece9713bed661305ab0de570eb12b7c28a032aaf602937"
C8 = "8564224395a4fbf7f2792baa22ee16dfc8f8e862e20342d3b2bcc211a3939af6"
C9 = "6ef14b5a76df7b5d24285e3a04ccbc6fd323620272b3787b5dc440fc1b75d294"
C10 = "abddff03dfd7710c79a750ce3e730365cbb2c8247a974170c1062683bc3e9152"

# (source, /proc/<pid>/cgroup text, expected fields)
SAMPLES = [
    ("netdata/netdata#4868 (systemd-cgls of a containerd node, cgroup v2, systemd driver)",
     "0::/kubepods.slice/kubepods-burstable.slice/"
     f"kubepods-burstable-pod55c6c714_b240_4dec_9a45_57b61696ab6e.slice/cri-containerd-{C1}.scope\n",
     dict(pod_uid="55c6c714-b240-4dec-9a45-57b61696ab6e", container_id=C1, runtime="containerd",
          qos="burstable", systemd_unit=f"cri-containerd-{C1}.scope")),
    ("netdata/netdata#4868 (a static pod: its UID is 32 hex digits, a manifest hash)",
     "0::/kubepods.slice/kubepods-burstable.slice/"
     f"kubepods-burstable-pod8daa50c3a64c9ff60bb9eab7b44b56fd.slice/cri-containerd-{C2}.scope\n",
     dict(pod_uid="8daa50c3a64c9ff60bb9eab7b44b56fd", container_id=C2, runtime="containerd",
          qos="burstable")),
    ("open-telemetry/opentelemetry-java#4507 (containerd, systemd driver on cgroup v1: the "
     "slice:prefix:id triple left in the path)",
     "11:perf_event:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:"
     f"cri-containerd:{C3}\n"
     "10:blkio:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_"
     f"94b56cbab864.slice:cri-containerd:{C3}\n1:name=systemd:/system.slice/containerd.service\n",
     dict(pod_uid="0125ec2f-b64a-4868-8f5b-94b56cbab864", container_id=C3, runtime="containerd",
          qos="besteffort")),
    ("duckdb/duckdb#16608 (containerd on cgroup v1, the same triple, burstable)",
     "13:cpuset:/kubepods-burstable-podb96a7488_3ee1_4bdc_9c98_155cc887b417.slice:"
     f"cri-containerd:{C9}\n12:rdma:/kubepods-burstable-podb96a7488_3ee1_4bdc_9c98_"
     f"155cc887b417.slice:cri-containerd:{C9}\n",
     dict(pod_uid="b96a7488-3ee1-4bdc-9c98-155cc887b417", container_id=C9, runtime="containerd",
          qos="burstable")),
    ("opencontainers/runc#4620 (CRI-O, systemd driver, cgroup v1)",
     "13:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_"
     f"434d_add7_4afaafdaef89.slice/crio-{C4}.scope\n11:files:/\n"
     "12:cpuset:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_"
     f"434d_add7_4afaafdaef89.slice/crio-{C4}.scope\n",
     dict(pod_uid="a5c1f8d5-1919-434d-add7-4afaafdaef89", container_id=C4, runtime="cri-o",
          qos="burstable", systemd_unit=f"crio-{C4}.scope")),
    ("lxc/lxc#3890 (Docker as the kubelet's runtime, systemd driver, cgroup v1)",
     "12:rdma:/\n11:freezer:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d44"
     f"24e6_bb13_42f4_a47a_45a4828bf54d.slice/docker-{C5}.scope\n",
     dict(pod_uid="7d4424e6-bb13-42f4-a47a-45a4828bf54d", container_id=C5, runtime="docker",
          qos="burstable")),
    ("kontena/pharos-cluster#440 (Docker, systemd driver; a version-1 UUID)",
     "4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod9692aa0e_748e_"
     f"11e8_8dfa_76d458035df6.slice/docker-{C10}.scope\n",
     dict(pod_uid="9692aa0e-748e-11e8-8dfa-76d458035df6", container_id=C10, runtime="docker",
          qos="besteffort")),
    ("containerd/nri#227 (kind: the kubelet's cgroup root is kubelet.slice)",
     "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-"
     "kubepods-besteffort-pod1e597579_417e_482f_bf65_5fe170c3aebd.slice/"
     f"cri-containerd-{C6}.scope\n",
     dict(pod_uid="1e597579-417e-482f-bf65-5fe170c3aebd", container_id=C6, runtime="containerd",
          qos="besteffort")),
    ("kata-containers/kata-containers#11598 (a guaranteed pod: no QoS level in the path)",
     "0::/kubepods.slice/kubepods-poddc430cd3_34b7_4ea6_be26_ddfd88d7ddff.slice/"
     f"cri-containerd-{C8}.scope\n",
     dict(pod_uid="dc430cd3-34b7-4ea6-be26-ddfd88d7ddff", container_id=C8, runtime="containerd",
          qos="guaranteed")),
    ("siderolabs/talos#3950 (cgroupfs driver: the bare container id below the pod)",
     f"0::/kubepods/besteffort/pod18d34ce4-50c7-452c-9df8-53c4a3fdf363/{C7}\n",
     dict(pod_uid="18d34ce4-50c7-452c-9df8-53c4a3fdf363", container_id=C7, runtime=None,
          qos="besteffort", systemd_unit=None)),
    ("NVIDIA/dcgm-exporter pidmapper_test.go (cgroupfs, a non-id container name)",
     "4:memory:/kubepods/besteffort/poda9c80282-3f6b-4d5b-84d5-a137a6668011/container123\n",
     dict(pod_uid="a9c80282-3f6b-4d5b-84d5-a137a6668011", container_id=None, qos="besteffort")),
    ("NVIDIA/dcgm-exporter pidmapper_test.go (a short, invalid pod UID)",
     "4:memory:/kubepods/pod123/container\n", dict(pod_uid=None, container_id=None)),
    ("NVIDIA/dcgm-exporter pidmapper_test.go (a plain service)",
     "4:memory:/system.slice/docker.service\n0::/user.slice\n",
     dict(pod_uid=None, systemd_unit="docker.service")),
    ("CRI-O's cgroupfs manager (ContainerCgroupPath: <pod cgroup>/crio-<id>) in a guaranteed"
     " pod (kubelet: no QoS level for guaranteed pods)",
     f"0::/kubepods/pod6b1c2f6e-4d0a-4c3e-9b8a-0f6f0d6c1a22/crio-{C4}\n",
     dict(pod_uid="6b1c2f6e-4d0a-4c3e-9b8a-0f6f0d6c1a22", container_id=C4, runtime="cri-o",
          qos="guaranteed")),
    ("CRI-O's container monitor (crio-conmon-<id>.scope) is not the container",
     "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7"
     f"_4afaafdaef89.slice/crio-conmon-{C4}.scope\n",
     dict(pod_uid="a5c1f8d5-1919-434d-add7-4afaafdaef89", container_id=None)),
    ("Docker without Kubernetes, cgroupfs driver (/docker/<id>)",
     f"12:memory:/docker/{C5}\n", dict(pod_uid=None, container_id=C5, runtime="docker")),
    ("Docker without Kubernetes, systemd driver, cgroup v2",
     f"0::/system.slice/docker-{C5}.scope\n",
     dict(pod_uid=None, container_id=C5, runtime="docker", systemd_unit=f"docker-{C5}.scope")),
    ("SchedMD/slurm#8 and task/cgroup's xcgroup paths (cgroup v1: /slurm/uid_/job_/step_)",
     "4:memory:/slurm/uid_1000/job_4242/step_0/task_0\n3:cpuset:/slurm/uid_1000/job_4242/step_0\n"
     "1:name=systemd:/system.slice/slurmd.service\n",
     dict(slurm_job_id="4242", slurm_step="0", slurm_uid=1000, pod_uid=None)),
    ("plazonic/cgroup_exporter#5 (multiple-slurmd hosts: /slurm_<node>/...)",
     "6:devices:/slurm_gpu-node-07/uid_2001/job_918273/step_batch/task_0\n",
     dict(slurm_job_id="918273", slurm_step="batch", slurm_uid=2001)),
    ("slurm.schedmd.com/cgroup_v2.html (cgroup/v2 plugin: slurmstepd.scope/job_/step_/user)",
     "0::/system.slice/slurmstepd.scope/job_77/step_3/user/task_1\n",
     dict(slurm_job_id="77", slurm_step="3", slurm_uid=None, systemd_unit="slurmstepd.scope")),
    ("a systemd service on a bare-metal host (cgroup v2)",
     "0::/system.slice/vllm-llama.service\n",
     dict(pod_uid=None, container_id=None, slurm_job_id=None, systemd_unit="vllm-llama.service")),
    ("a login session (user slice, cgroup v2)",
     "0::/user.slice/user-1000.slice/session-3.scope\n",
     dict(systemd_unit="session-3.scope", pod_uid=None)),
    ("kernel Documentation/admin-guide/cgroup-v2.rst, cgroup namespaces: seen from a pod with "
     "its own cgroup namespace (gpuwatch itself with hostPID), other cgroups read as /../..",
     "0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_"
     f"94b56cbab864.slice/cri-containerd-{C3}.scope\n",
     dict(pod_uid="0125ec2f-b64a-4868-8f5b-94b56cbab864", container_id=C3, qos="besteffort")),
    ("a container's own view with a private cgroup namespace: nothing to say",
     "0::/\n", dict(pod_uid=None, container_id=None, systemd_unit=None)),
    ("Docker, systemd driver, systemd inside the container: its own cgroups below the scope",
     f"0::/system.slice/docker-{C5}.scope/init.scope\n",
     dict(container_id=C5, runtime="docker", systemd_unit="init.scope")),
]

# What a user can create: systemd delegates user@<uid>.service to its user (cgroup v2), a
# container may own its subtree. Each names another team's pod or another user's job, and
# must be read as nothing but the unit it is.
SPOOFS = [
    ("a kubepods-shaped cgroup in the user's delegated systemd manager",
     "0::/user.slice/user-4242.slice/user@4242.service/kubepods.slice/kubepods-burstable.slice"
     f"/kubepods-burstable-pod55c6c714_b240_4dec_9a45_57b61696ab6e.slice/cri-containerd-{C1}"
     ".scope\n", f"cri-containerd-{C1}.scope"),
    ("the pod slice alone, right in the user's manager",
     "0::/user.slice/user-4242.slice/user@4242.service/kubepods-burstable-pod55c6c714_b240_4dec"
     f"_9a45_57b61696ab6e.slice/cri-containerd-{C1}.scope\n", f"cri-containerd-{C1}.scope"),
    ("cgroupfs-shaped, in the user's manager",
     "0::/user.slice/user-4242.slice/user@4242.service/kubepods/besteffort/pod18d34ce4-50c7-"
     f"452c-9df8-53c4a3fdf363/{C7}\n", "user@4242.service"),
    ("a Slurm v1 path in the user's manager",
     "0::/user.slice/user-4242.slice/user@4242.service/slurm/uid_2002/job_999/step_0\n",
     "user@4242.service"),
    ("a Slurm v2 path in the user's manager",
     "0::/user.slice/user-4242.slice/user@4242.service/system.slice/slurmstepd.scope/job_999/"
     "step_0\n", "slurmstepd.scope"),
    ("seen from gpuwatch's own cgroup namespace (relative path)",
     "0::/../../user.slice/user-4242.slice/user@4242.service/kubepods-besteffort-pod0125ec2f_"
     f"b64a_4868_8f5b_94b56cbab864.slice/cri-containerd-{C3}.scope\n",
     f"cri-containerd-{C3}.scope"),
    ("a rootless container of the user (podman under user@.service)",
     f"0::/user.slice/user-4242.slice/user@4242.service/user.slice/docker-{C5}.scope\n",
     f"docker-{C5}.scope"),
    ("a container that owns its subtree makes a pod cgroup inside it",
     f"0::/system.slice/docker-{C5}.scope/kubepods.slice/kubepods-burstable.slice/kubepods-"
     f"burstable-pod55c6c714_b240_4dec_9a45_57b61696ab6e.slice/cri-containerd-{C1}.scope\n",
     f"cri-containerd-{C1}.scope"),
    ("a Slurm tree below a service (not slurmd's root)",
     "0::/system.slice/evil.service/slurm/uid_2002/job_999/step_0\n", "evil.service"),
]


@pytest.mark.parametrize("source,text,unit", SPOOFS, ids=[s[0][:60] for s in SPOOFS])
def test_cgroups_a_user_can_make_name_no_pod_container_or_job(source, text, unit):
    info = cgroup.parse(text)
    assert (info.pod_uid, info.slurm_job_id, info.slurm_uid, info.qos) == (None,) * 4, source
    # the only real container among them: the Docker one the kubepods tree was made in
    real = C5 if text.startswith("0::/system.slice/docker-") else None
    assert info.container_id == real, source
    assert info.systemd_unit == unit


def test_a_pod_or_job_nested_in_a_real_one_is_the_real_one():
    """A process in a pod (or job) that makes cgroups below its own names no other."""
    real = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_"
            f"434d_add7_4afaafdaef89.slice/cri-containerd-{C4}.scope/kubepods-besteffort-pod"
            f"0125ec2f_b64a_4868_8f5b_94b56cbab864.slice/cri-containerd-{C3}.scope\n")
    info = cgroup.parse(real)
    assert (info.pod_uid, info.container_id) == ("a5c1f8d5-1919-434d-add7-4afaafdaef89", C4)
    job = cgroup.parse("0::/slurm/uid_1000/job_4242/step_0/task_0/job_999/step_0\n")
    assert (job.slurm_job_id, job.slurm_step, job.slurm_uid) == ("4242", "0", 1000)
    v2 = cgroup.parse("0::/system.slice/slurmstepd.scope/job_77/step_3/user/job_999/step_0\n")
    assert (v2.slurm_job_id, v2.slurm_step) == ("77", "3")


@pytest.mark.parametrize("source,text,expected", SAMPLES, ids=[s[0][:60] for s in SAMPLES])
def test_real_world_samples(source, text, expected):
    info = cgroup.parse(text)
    for field, value in expected.items():
        assert getattr(info, field) == value, f"{source}: {field}"


def test_uid_underscores_become_dashes_and_qos_defaults_to_guaranteed():
    info = cgroup.parse_path("/kubepods.slice/kubepods-pod0a1b2c3d_0000_1111_2222_333344445555"
                             f".slice/cri-containerd-{C1}.scope")
    assert info.pod_uid == "0a1b2c3d-0000-1111-2222-333344445555"
    assert info.qos == "guaranteed"


def test_the_most_specific_line_wins_on_hybrid_hosts():
    # the v2 line names only a slice; the v1 memory line names the pod and container
    text = ("0::/system.slice/containerd.service\n"
            f"4:memory:/kubepods/burstable/pod18d34ce4-50c7-452c-9df8-53c4a3fdf363/{C7}\n")
    info = cgroup.parse(text)
    assert info.pod_uid == "18d34ce4-50c7-452c-9df8-53c4a3fdf363" and info.container_id == C7


def test_slurm_components_outside_a_slurm_root_are_ignored():
    assert cgroup.parse("0::/user.slice/job_12/step_0\n").slurm_job_id is None


@pytest.mark.parametrize("text", [
    "", "garbage", "\x00\xff" * 100, "a:b:c\n", "x::/kubepods/podzz/1\n",
    "0::" + "/a" * 50_000, "0::/kubepods/burstable/pod" + "f" * 500 + "\n",
])
def test_hostile_input_parses_to_nothing(text):
    info = cgroup.parse(text)
    assert not info.known


@given(st.text(max_size=400))
def test_never_raises(text):
    cgroup.parse(text)
