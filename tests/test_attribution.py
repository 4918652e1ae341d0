"""Attribution end to end below the daemon: a fake /proc tree built from the real-world cgroup
samples, a real gRPC server implementing the kubelet's pod-resources v1 service (from the same
proto as the client) on a unix socket, the join, the cache, and `gpuwatch attribution`."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from concurrent import futures

import grpc
import pytest

from gpuwatch.attribution import join as join_mod
from gpuwatch.attribution.cgroup import CgroupInfo
from gpuwatch.attribution.podresources import (
    ContainerDevices,
    PodResourcesUnavailable,
    api_pb2,
    api_pb2_grpc,
    list_containers,
)
from gpuwatch.attribution.resolver import ProcHost, resolve
from gpuwatch.attribution.source import AttributionSource
from gpuwatch.exporter.snapshot import SourceStatus
from gpuwatch.model import GpuSample, ProcessSample
from tests.helpers import REPO, child_env
from tests.test_attribution_cgroup import C1, C4, C5, C7, SAMPLES

UID_A = "55c6c714-b240-4dec-9a45-57b61696ab6e"  # netdata#4868 sample (containerd, systemd)
UID_B = "a5c1f8d5-1919-434d-add7-4afaafdaef89"  # runc#4620 sample (CRI-O)
UID_C = "18d34ce4-50c7-452c-9df8-53c4a3fdf363"  # talos#3950 sample (cgroupfs)
GPU0, GPU1, GPU2 = "GPU-0a0a", "GPU-1b1b", "GPU-2c2c"


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's side of pod-resources v1, answering from a list of pods."""

    def __init__(self, pods) -> None:
        self.pods = pods
        self.calls = 0

    def List(self, request, context):  # the gRPC method name
        self.calls += 1
        return api_pb2.ListPodResourcesResponse(pod_resources=[
            api_pb2.PodResources(name=name, namespace=ns, containers=[
                api_pb2.ContainerResources(name=cname, devices=[
                    api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids)
                ] if ids else [])
                for cname, ids in containers])
            for ns, name, containers in self.pods])


# llama has 2 GPUs and a sidecar; embedder shares GPU1 by time-slicing (replica ids "::n")
PODS = [
    ("serving", "llama-70b-7c9f", [("vllm", [GPU0, GPU1 + "::0"]), ("metrics-proxy", [])]),
    ("research", "embedder-5d8f9", [("embed", [GPU1 + "::1"])]),
    ("research", "tokenizer-6b7d4", [("worker", [GPU2])]),
    ("kube-system", "coredns-565d847f94-8x2kq", [("coredns", [])]),
]


@pytest.fixture
def kubelet(tmp_path):
    servicer = Kubelet(PODS)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    path = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{path}")
    server.start()
    servicer.socket = str(path)
    yield servicer
    server.stop(None)


def cgroup_line(uid: str, cid: str) -> str:
    u = uid.replace("-", "_")
    return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/"
            f"cri-containerd-{cid}.scope\n")


def fake_proc(root, entries: dict[int, tuple[str, bytes | None]]):
    """pid -> (cgroup text, environ bytes or None)."""
    for pid, (text, environ) in entries.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "cgroup").write_text(text)
        if environ is not None:
            (d / "environ").write_bytes(environ)
    return root


# -- pod-resources over a real gRPC server ---------------------------------------------


def test_list_containers_from_a_real_pod_resources_server(kubelet):
    got = {(c.namespace, c.pod, c.container): c.devices
           for c in list_containers(kubelet.socket)}
    assert got[("serving", "llama-70b-7c9f", "vllm")] == {GPU0, GPU1}  # replica suffix gone
    assert got[("research", "embedder-5d8f9", "embed")] == {GPU1}
    assert got[("serving", "llama-70b-7c9f", "metrics-proxy")] == frozenset()
    assert len(got) == 5 and kubelet.calls == 1


def test_absent_or_wrong_socket_fails_with_a_reason(tmp_path):
    with pytest.raises(PodResourcesUnavailable, match="no pod-resources socket"):
        list_containers(str(tmp_path / "missing.sock"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(PodResourcesUnavailable, match="not a unix socket"):
        list_containers(str(tmp_path / "file"))
    # a socket nobody serves: an answer within the timeout, not a hang
    dead = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(dead))
    s.close()
    with pytest.raises(PodResourcesUnavailable, match="List failed"):
        list_containers(str(dead), timeout=1.0)  # a hang would end in the test's timeout


# -- the join ---------------------------------------------------------------------------


def _containers():
    return [ContainerDevices(ns, pod, c, frozenset(i.split("::")[0] for i in ids))
            for ns, pod, conts in PODS for c, ids in conts]


def test_join_names_pods_through_their_gpus_and_rules_out_matched_pods():
    cg = {1: CgroupInfo(pod_uid=UID_A, container_id=C1), 2: CgroupInfo(pod_uid=UID_A,
          container_id=C1), 3: CgroupInfo(pod_uid=UID_B, container_id=C4),
          4: CgroupInfo(pod_uid=UID_C, container_id=C7)}
    got = join_mod.join({1: {GPU0}, 2: {GPU1}, 3: {GPU1}, 4: {GPU2}}, cg, _containers())
    # UID_A uses GPU0+GPU1: only llama holds both; UID_B on the shared GPU1 is then embedder
    assert (got[1].namespace, got[1].pod, got[1].container) == ("serving", "llama-70b-7c9f",
                                                                 "vllm")
    assert got[2].pod == "llama-70b-7c9f" and got[2].container == "vllm"  # not the sidecar
    assert (got[3].namespace, got[3].pod, got[3].container) == ("research", "embedder-5d8f9",
                                                                 "embed")
    assert got[4].pod == "tokenizer-6b7d4" and got[4].source == "cgroup+podresources"


def test_an_ambiguous_pod_stays_unnamed():
    # both pods on the shared GPU only: nothing tells them apart
    cg = {1: CgroupInfo(pod_uid=UID_A), 2: CgroupInfo(pod_uid=UID_B)}
    got = join_mod.join({1: {GPU1}, 2: {GPU1}}, cg, _containers())
    assert got[1].pod is None and got[2].pod is None
    assert got[1].pod_uid == UID_A and got[1].source == "cgroup"


def test_a_process_without_a_readable_cgroup_on_a_gpu_of_one_container():
    got = join_mod.join({9: {GPU2}, 10: {GPU1}}, {}, _containers())
    assert (got[9].pod, got[9].container, got[9].source) == ("tokenizer-6b7d4", "worker",
                                                              "podresources")
    assert got[10].pod is None  # GPU1 has two holders


def test_without_pod_resources_only_the_cgroup_speaks():
    got = join_mod.join({1: {GPU0}}, {1: CgroupInfo(pod_uid=UID_A, container_id=C1,
                                                    qos="burstable")}, None)
    assert got[1].pod is None and got[1].pod_uid == UID_A and got[1].qos == "burstable"


# -- the CLI over a fake /proc built from the real samples ---------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwatch", "attribution", *args],
                          capture_output=True, text=True, env=child_env(), cwd=REPO,
                          timeout=60)


def test_cli_resolves_the_real_world_samples(tmp_path):
    entries = {1000 + i: (text, None) for i, (_, text, _) in enumerate(SAMPLES)}
    root = fake_proc(tmp_path / "proc", entries)
    res = _cli("--proc-root", str(root), "--podresources-socket", "", *map(str, entries))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert [d["pid"] for d in lines] == list(entries)
    for doc, (source, _, expected) in zip(lines, SAMPLES, strict=True):
        assert set(doc) == {"pid", "namespace", "pod", "pod_uid", "container", "container_id",
                            "qos", "slurm_job_id", "slurm_job_user", "systemd_unit",
                            "pod_labels", "pod_annotations", "source",
                            "slurm_job_id_self_reported"}
        for field in ("pod_uid", "container_id", "qos", "slurm_job_id", "systemd_unit"):
            if field in expected:
                assert doc[field] == expected[field], f"{source}: {field}"
    assert "pod-resources disabled" in res.stderr


def test_cli_joins_the_cgroup_with_a_real_kubelet(tmp_path, kubelet):
    root = fake_proc(tmp_path / "proc", {
        101: (cgroup_line(UID_A, C1), None), 102: (cgroup_line(UID_A, C1), None),
        103: (cgroup_line(UID_B, C4), None), 104: (cgroup_line(UID_C, C5), None),
    })
    res = _cli("--proc-root", str(root), "--podresources-socket", kubelet.socket,
               "--pid-gpu", f"101={GPU0}", "--pid-gpu", f"102={GPU1}",
               "--pid-gpu", f"103={GPU1}", "--pid-gpu", f"104={GPU2}", "101", "103", "104")
    assert res.returncode == 0, res.stderr
    docs = {d["pid"]: d for d in map(json.loads, res.stdout.splitlines())}
    assert docs[101]["namespace"] == "serving" and docs[101]["pod"] == "llama-70b-7c9f"
    assert docs[101]["container"] == "vllm" and docs[101]["container_id"] == C1
    assert docs[103]["pod"] == "embedder-5d8f9"
    assert docs[104]["pod"] == "tokenizer-6b7d4" and docs[104]["qos"] == "burstable"
    assert docs[104]["source"] == "cgroup+podresources"


def test_cli_shows_the_self_reported_slurm_job_for_what_it_is_and_nothing_else(tmp_path):
    """SLURM_JOB_ID is whatever the process set: shown apart, never the job id that labels
    and routes."""
    secret = b"HF_TOKEN=hf_verysecret"
    root = fake_proc(tmp_path / "proc", {
        201: ("0::/user.slice/user-1000.slice/session-3.scope\n",
              secret + b"\0SLURM_JOB_ID=5512\0PATH=/usr/bin\0"),
        202: ("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n",
              b"SLURM_JOB_ID=99999\0"),  # the cgroup wins over the environment
        203: ("0::/\n", b"SLURM_JOB_ID=12;rm -rf /\0"),  # not a job id: ignored
    })
    res = _cli("--proc-root", str(root), "--podresources-socket", "", "201", "202", "203")
    assert res.returncode == 0, res.stderr
    docs = {d["pid"]: d for d in map(json.loads, res.stdout.splitlines())}
    assert docs[201]["slurm_job_id"] is None and docs[201]["slurm_job_user"] is None
    assert docs[201]["slurm_job_id_self_reported"] == "5512"
    assert docs[201]["source"] == "cgroup+environ-self-reported"
    assert docs[202]["slurm_job_id"] == "77" and docs[202]["source"] == "cgroup"
    assert docs[202]["slurm_job_id_self_reported"] is None
    assert docs[203]["slurm_job_id"] is docs[203]["slurm_job_id_self_reported"] is None
    assert "verysecret" not in res.stdout + res.stderr


def test_cli_unknown_pid_is_all_null_and_misuse_exits_2(tmp_path):
    res = _cli("--proc-root", str(tmp_path), "--podresources-socket", "", "4194304")
    assert res.returncode == 0
    doc = json.loads(res.stdout)
    assert doc["pid"] == 4194304 and all(v is None for k, v in doc.items() if k != "pid")
    for bad, flag in ((["0"], "PID"), (["--", "-5"], "PID"), (["12x"], "PID"),
                      (["4194305"], "PID"), (["--pid-gpu", "7", "7"], "--pid-gpu"),
                      (["--pid-gpu", "x=GPU-1", "7"], "--pid-gpu")):
        res = _cli("--podresources-socket", "", *bad)
        assert res.returncode == 2, bad
        assert res.stderr.count("\n") == 1 and flag in res.stderr, res.stderr


def test_huge_or_special_proc_files_are_bounded(tmp_path):
    root = tmp_path / "proc"
    (root / "300").mkdir(parents=True)
    (root / "300" / "cgroup").write_bytes(b"0::/a" * 1_000_000)  # 5 MB
    os.mkfifo(root / "300" / "environ")  # a reader that would block forever
    res = resolve(ProcHost(str(root), ""), {300: set()})
    assert res.attributions[300].slurm_job_id is None


# -- the daemon's cached source -----------------------------------------------------------


class CountingHost(ProcHost):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.lists = 0

    def containers(self):
        self.lists += 1
        return super().containers()


def _gpus(pids):
    return [GpuSample(index=i, uuid=g, processes=[ProcessSample(pid=p, create_time=1.0)
                                                  for p in ps])
            for i, (g, ps) in enumerate(pids.items())]


def test_source_refreshes_on_a_slow_interval_not_per_tick(tmp_path, kubelet):
    root = fake_proc(tmp_path / "proc", {101: (cgroup_line(UID_A, C1), None),
                                         104: (cgroup_line(UID_C, C5), None)})
    host = CountingHost(str(root), kubelet.socket)
    status = SourceStatus()
    src = AttributionSource(host, status, refresh_seconds=60, min_refresh_seconds=5)

    async def ticks():
        for t in range(0, 20, 2):  # ten ticks, two seconds apart
            gpus = _gpus({GPU0: [101], GPU1: [], GPU2: [104] if t >= 10 else []})
            await src.update(gpus, 1000.0 + t)
        return gpus

    gpus = asyncio.run(ticks())
    src.close()
    # the first tick, then once for the new pid (after min_refresh): not ten times
    assert host.lists == 2
    p101, p104 = gpus[0].processes[0], gpus[2].processes[0]
    assert (p101.namespace, p101.pod, p101.container) == ("serving", "llama-70b-7c9f", "vllm")
    assert (p104.namespace, p104.pod) == ("research", "tokenizer-6b7d4")
    assert status.up and status.reason == ""


def test_source_fails_soft_and_says_why(tmp_path):
    root = fake_proc(tmp_path / "proc", {101: (cgroup_line(UID_A, C1), None)})
    status = SourceStatus()
    src = AttributionSource(ProcHost(str(root), str(tmp_path / "kubelet.sock")), status)
    gpus = _gpus({GPU0: [101]})
    asyncio.run(src.update(gpus, 1.0))
    src.close()
    assert gpus[0].processes[0].pod == "" and status.up
    assert "no pod-resources socket" in status.reason


def test_on_a_slurm_node_every_process_names_its_job(tmp_path):
    """cgroup v1 and v2 job paths and dcgm-exporter's job-mapping files: every process series
    they place carries slurm_job_id; SLURM_JOB_ID from a process's environment labels
    nothing."""
    from gpuwatch.exporter.families import process as process_family
    from gpuwatch.exporter.snapshot import Snapshot
    from gpuwatch.model import Tick

    root = fake_proc(tmp_path / "proc", {
        401: ("4:memory:/slurm/uid_0/job_4242/step_0/task_0\n", None),
        402: ("0::/system.slice/slurmstepd.scope/job_77/step_3/user/task_1\n", None),
        403: ("0::/user.slice/user-0.slice/session-9.scope\n", b"SLURM_JOB_ID=5512\0"),
        404: ("0::/system.slice/sshd.service\n", b"HOME=/root\0"),
    })
    mapping = tmp_path / "hpc-jobs"
    mapping.mkdir()
    (mapping / "3").write_text("job-2026-01\n")  # GPU index 3 runs one job
    (mapping / "2").write_text("a\nb\n")  # two jobs share GPU 2: no single answer
    (mapping / "README").write_text("not a GPU index")
    gpus = [GpuSample(index=i, uuid=f"GPU-{i}", processes=[ProcessSample(pid=p, create_time=1.0)])
            for i, p in enumerate((401, 402, 403, 404))]
    gpus.append(GpuSample(index=4, uuid="GPU-4", processes=[ProcessSample(pid=404,
                                                                           create_time=1.0)]))
    src = AttributionSource(ProcHost(str(root), "", job_mapping_dir=str(mapping)),
                            SourceStatus())
    asyncio.run(src.update(gpus, 1.0))
    src.close()
    jobs = {(g.index, p.pid): p.slurm_job_id for g in gpus for p in g.processes}
    # 404 is on GPU 3 (one job) and GPU 4 (no file): the one job
    assert jobs == {(0, 401): "4242", (1, 402): "77", (2, 403): "", (3, 404): "job-2026-01",
                    (4, 404): "job-2026-01"}
    assert src.cache[(403, 1.0)].slurm_job_id_self_reported == "5512"
    assert src.cache[(401, 1.0)].slurm_job_user == "root"  # uid_0 in the path
    fams = {m.name: m for m in process_family.collect(Snapshot(tick=Tick(t=1.0, gpus=gpus)))}
    samples = fams["gpuwatch_process_info"].samples
    assert [s.labels["slurm_job_id"] != "" for s in samples].count(True) == 4


# -- events and recordings -------------------------------------------------------------------


def test_events_name_the_owner_even_after_the_process_exited():
    from gpuwatch.config import Config
    from gpuwatch.events import Event
    from gpuwatch.model import Tick
    from gpuwatch.signals.pipeline import Pipeline

    def proc(pid, pod):
        return ProcessSample(pid=pid, namespace="serving", pod=pod, container="vllm")

    pipe = Pipeline(Config())
    tick = Tick(t=1.0, gpus=[GpuSample(index=0, uuid=GPU0, processes=[proc(1, "a"), proc(2, "a")]),
                             GpuSample(index=1, uuid=GPU1, processes=[proc(3, "a"), proc(4, "b")])])
    evs = [Event(t=1.0, signal="memory_leak", state="firing", gpu_uuid=GPU0, pid=1),
           Event(t=1.0, signal="memory_leak", state="firing", gpu_uuid=GPU0),
           Event(t=1.0, signal="memory_leak", state="firing", gpu_uuid=GPU1)]
    evs = pipe._attribute(tick, evs)  # events are immutable: named copies come back
    assert (evs[0].namespace, evs[0].pod, evs[0].container) == ("serving", "a", "vllm")
    assert evs[1].pod == "a"  # every process on GPU0 is pod a's
    assert evs[2].pod is None  # GPU1 is shared by two pods
    # pid 1 exits; the event resolving its condition still names its pod
    gone = Tick(t=3.0, gpus=[GpuSample(index=0, uuid=GPU0, processes=[proc(2, "a")])])
    resolved = Event(t=3.0, signal="memory_leak", state="resolved", gpu_uuid=GPU0, pid=1)
    resolved, = pipe._attribute(gone, [resolved])
    assert resolved.pod == "a"


def test_recordings_keep_the_owner_so_replay_names_it_too(tmp_path):
    from gpuwatch.model import Tick
    from gpuwatch.recording import Recorder, read_recording

    path = str(tmp_path / "rec.jsonl")
    rec = Recorder(path, "node-1", 2.0)
    rec.write(Tick(t=1.0, gpus=[GpuSample(index=0, uuid=GPU0, processes=[ProcessSample(
        pid=7, namespace="research", pod="tokenizer-6b7d4", container="worker",
        slurm_job_id="")])]))
    rec.close()
    _, ticks = read_recording(path)
    (p,) = next(iter(ticks)).gpus[0].processes
    assert (p.namespace, p.pod, p.container, p.slurm_job_id) == ("research", "tokenizer-6b7d4",
                                                                 "worker", "")
    assert '"slurm_job_id"' not in (tmp_path / "rec.jsonl").read_text()  # "" is omitted


def test_a_periodic_refresh_never_delays_a_tick(tmp_path, kubelet):
    class SlowHost(ProcHost):
        gate: threading.Event | None = None

        def containers(self):
            if self.gate is not None:  # a kubelet that answers only when the test says so
                self.gate.wait(60)
            return super().containers()

    root = fake_proc(tmp_path / "proc", {101: (cgroup_line(UID_A, C1), None)})
    host = SlowHost(str(root), kubelet.socket)
    src = AttributionSource(host, SourceStatus(), refresh_seconds=10, min_refresh_seconds=5)

    async def go():
        await src.update(_gpus({GPU0: [101]}), 0.0)  # a new process: awaited
        host.gate = threading.Event()
        kubelet.pods = [("serving", "llama-70b-7c9f-v2", [("vllm", [GPU0])])]
        gpus = _gpus({GPU0: [101]})
        # Periodic, with a kubelet that has not answered: a tick that waited for it would
        # hold the new pod name (and block until the gate's timeout).
        await src.update(gpus, 20.0)
        before = gpus[0].processes[0].pod
        host.gate.set()
        for _ in range(400):
            await asyncio.sleep(0.05)
            gpus = _gpus({GPU0: [101]})
            await src.update(gpus, 22.0)
            if gpus[0].processes[0].pod != before:
                break
        return before, gpus[0].processes[0].pod

    before, after = asyncio.run(go())
    src.close()
    assert before == "llama-70b-7c9f"  # the tick went on with the cached answer
    assert after == "llama-70b-7c9f-v2"


def test_grpc_is_loaded_only_when_the_kubelet_socket_exists(tmp_path):
    code = ("import sys, asyncio, gpuwatch.daemon, gpuwatch.cli\n"
            "from gpuwatch.attribution.resolver import ProcHost, resolve\n"
            f"resolve(ProcHost('/proc', {str(tmp_path / 'absent.sock')!r}), {{1: set()}})\n"
            "print(sorted(m for m in ('grpc', 'google.protobuf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, env=child_env(), check=True).stdout
    assert out.strip() == "[]"


def test_a_real_process_on_the_real_proc(tmp_path):
    """The host's own /proc: a child started with SLURM_JOB_ID claims its job (as root)."""
    if os.geteuid() != 0:
        pytest.skip("reading another process's environment needs root")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, "SLURM_JOB_ID": "777001", "API_KEY": "k3y"})
    try:
        res = resolve(ProcHost("/proc", ""), {child.pid: set(), os.getpid(): set()})
        att = res.attributions[child.pid]
        assert att.slurm_job_id is None and att.slurm_job_id_self_reported == "777001"
        assert att.source == "environ-self-reported"
        assert "k3y" not in repr(res)
    finally:
        child.kill()
        child.wait()


def test_replay_names_the_pod_in_its_human_output():
    from gpuwatch.events import Event
    from gpuwatch.logfmt import human_line

    ev = Event(t=1.0, signal="memory_leak", state="firing", gpu_uuid=GPU0, pid=7,
               namespace="research", pod="tokenizer-6b7d4", slurm_job_id="4242")
    assert "pod research/tokenizer-6b7d4, slurm job 4242" in human_line(ev)
    assert "pod " not in human_line(Event(t=1.0, signal="memory_leak", state="firing", pid=7))


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    n, out = len(payload), bytearray([number << 3 | 2])
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out) + payload


def test_a_kubelet_answer_with_the_fields_gpuwatch_does_not_read(tmp_path):
    """The kubelet's v1 messages carry more than gpuwatch's .proto declares (cpu_ids, memory,
    topology, dynamic_resources): the answer, as raw bytes from a gRPC server, still parses."""
    topology = _field(1, b"\x08\x01")  # TopologyInfo{nodes: [NUMANode{ID: 1}]}
    device = (_field(1, b"nvidia.com/gpu") + _field(2, GPU0.encode()) + _field(3, topology))
    memory = _field(1, b"memory") + b"\x10\x80\x80\x80\x80\x04"  # ContainerMemory size 1 GiB
    dra = _field(2, b"claim-a") + _field(3, b"serving")  # DynamicResource
    container = (_field(1, b"vllm") + _field(2, device) + _field(3, b"\x02\x03")
                 + _field(4, memory) + _field(5, dra))
    raw = _field(1, _field(1, b"llama-70b-7c9f") + _field(2, b"serving") + _field(3, container))

    handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(lambda request, context: raw)})
    server = grpc.server(futures.ThreadPoolExecutor(1))
    server.add_generic_rpc_handlers((handler,))
    sock = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        (c,) = list_containers(str(sock))
    finally:
        server.stop(None)
    assert (c.namespace, c.pod, c.container, c.devices) == ("serving", "llama-70b-7c9f", "vllm",
                                                            {GPU0})
