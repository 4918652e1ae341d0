"""GPU node health handed to the node tools, end to end: real daemons with simulated faults
(the fake driver's XID 79 and XID 13, a GPU lost and uncorrectable ECC errors behind the
real NVML backend; `--simulate leak` on a fast clock for a critical time to OOM), `gpuwatch
npd` run as Node Problem Detector runs its plugins (the shipped custom-plugin-monitor's
rules, path, arguments and timeouts), and a real gRPC server on a Unix socket serving
NVSentinel's PlatformConnector from its own proto."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuwatch.exporter.snapshot import SourceStatus
from gpuwatch.model import GpuSample
from gpuwatch.nodehealth import npd
from gpuwatch.nodehealth.config import NvSentinelConfig
from gpuwatch.nodehealth.verdict import gpu_findings
from gpuwatch.signals.derived import GpuSignals
from tests.helpers import REPO, Proc, child_env, free_port, http_get, wait_until

grpc = pytest.importorskip("grpc")
from gpuwatch.nodehealth.nvsentinel import Publisher  # noqa: E402
from gpuwatch.nodehealth.nvsentinel_api import health_event_pb2 as pb  # noqa: E402
from gpuwatch.nodehealth.nvsentinel_api import health_event_pb2_grpc as pb_grpc  # noqa: E402

MONITOR = json.loads((REPO / "exporters" / "npd" / "gpuwatch-custom-plugin-monitor.json")
                     .read_text())
GPUWATCH = Path(sys.executable).parent / "gpuwatch"


# -- the verdicts --------------------------------------------------------------------------

def codes(gpu: dict, sig: dict | None = None, since=None) -> list[tuple[str, str, bool, str]]:
    base = {"index": 0, "uuid": "GPU-a"}
    return [(f.code, f.severity, f.fatal, f.action)
            for f in gpu_findings({**base, **gpu}, sig, warnings_since=since)]


def test_findings_follow_the_xid_table_and_the_health_fields():
    assert codes({}) == []
    assert codes({"xid_events_total": {"79": 2}}) == [
        ("XID_79", "critical", True, "reboot_node")]
    assert codes({"xid_events_total": {"48": 1}}) == [("XID_48", "critical", True, "reset_gpu")]
    assert codes({"xid_events_total": {"64": 1}}) == [
        ("XID_64", "critical", True, "contact_support")]
    # informational XIDs say nothing; application ones are warnings while recent
    assert codes({"xid_events_total": {"43": 5}}) == []
    seen = {"xid_events_total": {"13": 1, "999": 1}, "xid_last_seen": {"13": 100.0,
                                                                      "999": 50.0}}
    assert codes(seen, since=90.0) == [("XID_13", "warning", False, "restart_app")]
    assert codes(seen, since=40.0) == [("XID_13", "warning", False, "restart_app"),
                                       ("XID_999", "warning", False, "investigate")]
    assert codes(seen, since=200.0) == []
    assert codes({"lost": True}) == [("GPU_LOST", "critical", True, "reboot_node")]
    assert codes({"ecc_volatile_uncorrected_total": 3}) == [
        ("ECC_UNCORRECTABLE", "critical", True, "reset_gpu")]
    assert codes({"ecc_volatile_uncorrected_total": 0, "remapped_rows_pending": True}) == [
        ("ROW_REMAP_PENDING", "critical", True, "reset_gpu")]
    assert codes({"remapped_rows_pending": True, "remapped_rows_failure": True}) == [
        ("ROW_REMAP_FAILURE", "critical", True, "contact_support")]
    # memory pressure: never fatal to the node, the leaking application is restarted
    assert codes({}, {"time_to_oom_seconds": 300.0, "time_to_oom_severity": 2}) == [
        ("TIME_TO_OOM_CRITICAL", "critical", False, "restart_app")]
    assert codes({}, {"time_to_oom_severity": 1, "zone": 2}) == [
        ("MEMORY_ZONE_CRITICAL", "critical", False, "restart_app"),
        ("TIME_TO_OOM_WARNING", "warning", False, "restart_app")]
    # hostile or odd values from a state document are ignored, not trusted
    assert codes({"xid_events_total": {"x": 9, "-1": 3, "79": "many"}}) == []


def state(gpus: list[dict], signals: dict | None = None, ready=True, nvml_up=True) -> dict:
    return {"ready": ready, "sources": {"nvml": {"up": nvml_up, "reason": "driver gone"}},
            "sample": {"gpus": gpus}, "signals": {"gpus": signals or {}}}


def test_npd_checks_are_ok_problem_or_unknown():
    healthy = state([{"index": 0, "uuid": "GPU-a"}])
    for check in npd.CHECKS:
        assert npd.judge(check, healthy, 1000.0, 30)[0] == npd.OK
    sick = state([{"index": 0, "uuid": "GPU-a", "xid_events_total": {"79": 1}},
                  {"index": 1, "uuid": "GPU-b", "lost": True}],
                 {"GPU-b": {"time_to_oom_severity": 2, "time_to_oom_seconds": 60.0}})
    status, message = npd.judge("gpu-health", sick, 1000.0, 30)
    assert status == npd.PROBLEM and message.startswith("XID_79: GPU 0 (GPU-a): XID 79")
    assert message.endswith("(+1 more)")  # the lost GPU 1
    status, message = npd.judge("memory-pressure", sick, 1000.0, 30)
    assert status == npd.PROBLEM and message.startswith("TIME_TO_OOM_CRITICAL: GPU 1")
    assert npd.judge("warnings", sick, 1000.0, 30)[0] == npd.OK
    assert npd.judge("gpu-health", state([], ready=False), 0, 30)[0] == npd.UNKNOWN
    assert npd.judge("gpu-health", state([{"uuid": "x"}], nvml_up=False), 0, 30) == (
        npd.UNKNOWN, "gpuwatch cannot read the GPUs: driver gone")
    assert npd.judge("memory-pressure", state([]), 0, 30)[0] == npd.UNKNOWN


# -- Node Problem Detector, as it runs plugins ----------------------------------------------

def run_rule(rule: dict, url: str) -> tuple[str, str]:
    """What NPD's custom plugin monitor does with one rule: exec path and args (no shell),
    kill it at the rule's timeout, 0 -> OK, 1 -> NonOK, anything else Unknown, the output
    cut at max_output_length."""
    args = [url if a == npd.DEFAULT_URL else a for a in rule["args"]]
    timeout = float(rule["timeout"].rstrip("s"))
    limit = MONITOR["pluginConfig"]["max_output_length"]
    try:
        r = subprocess.run([str(GPUWATCH), *args], capture_output=True, text=True,
                           timeout=timeout, env=child_env())
    except subprocess.TimeoutExpired:
        return "Unknown", "Timeout when running plugin"
    status = {0: "OK", 1: "NonOK"}.get(r.returncode, "Unknown")
    return status, r.stdout.strip().splitlines()[0][:limit] if r.stdout.strip() else ""


def npd_pass(url: str) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str]]]:
    """One invocation of every rule: node conditions (type -> (status, message)), and the
    events the temporary rules raise (reason, message)."""
    conditions = {c["type"]: ("False", c["message"]) for c in MONITOR["conditions"]}
    events = []
    for rule in MONITOR["rules"]:
        status, message = run_rule(rule, url)
        if rule["type"] == "permanent":
            conditions[rule["condition"]] = (
                {"OK": "False", "NonOK": "True"}.get(status, "Unknown"), message)
        elif status == "NonOK":
            events.append((rule["reason"], message))
    return conditions, events


def test_the_shipped_monitor_runs_gpuwatch_npd_within_npds_timeouts():
    cfg = MONITOR["pluginConfig"]
    assert MONITOR["plugin"] == "custom" and cfg["concurrency"] == 1
    assert {c["type"] for c in MONITOR["conditions"]} == {"GpuwatchGpuUnhealthy",
                                                         "GpuwatchGpuMemoryPressure"}
    for rule in MONITOR["rules"]:
        assert rule["path"] == npd.COMMAND and rule["args"][0] == "npd"
        ctx = npd.npd.make_context("npd", list(rule["args"][1:]))
        # ours ends first, so NPD reads our "unknown" and its reason
        assert ctx.params["timeout"] < float(rule["timeout"].rstrip("s"))
    assert npd.monitor() == MONITOR


class PlatformConnector(pb_grpc.PlatformConnectorServicer):
    """NVSentinel's platform connector as far as a monitor sees it: the gRPC service of its
    health_event.proto on a Unix socket, keeping what it was sent."""

    def __init__(self, path: Path, fail: int = 0) -> None:
        self.events: list = []
        self.fail = fail  # answer UNAVAILABLE this many times first
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
        pb_grpc.add_PlatformConnectorServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def HealthEventOccurredV1(self, request, context):  # the service's method name
        if self.fail:
            self.fail -= 1
            context.abort(grpc.StatusCode.UNAVAILABLE, "starting")
        assert request.version == 1
        self.events.extend(request.events)
        from google.protobuf import empty_pb2
        return empty_pb2.Empty()

    def unhealthy(self) -> list:
        return [e for e in self.events if not e.isHealthy]

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def connector(tmp_path):
    path = tmp_path / "nvs" / "platform-connector.sock"
    path.parent.mkdir()
    pc = PlatformConnector(path)
    pc.path = path
    yield pc
    pc.stop()


def fault_daemon(tmp_path: Path, faults: list[str], *args: str, socket_path: Path,
                 env: dict | None = None) -> tuple[Proc, str]:
    port = free_port()
    cfg = tmp_path / f"gpuwatch-{port}.toml"
    cfg.write_text(f'[nvsentinel]\nenabled = true\nsocket = "{socket_path}"\n'
                   'node_name = "gpu-node-7"\n')
    argv = [sys.executable, "-m", "tests.fault_daemon", *faults, "--", "--listen",
            f"127.0.0.1:{port}", "--config", str(cfg), *args]
    proc = Proc(argv, tmp_path, f"fault-{port}", env=child_env(
        PYTHONPATH=str(REPO), STATE_DIRECTORY=str(tmp_path / f"state-{port}"), **(env or {})))
    url = f"http://127.0.0.1:{port}"

    def ready():
        if not proc.alive():
            raise RuntimeError(proc.output())
        return http_get(url + "/readyz", 1.0)[0] == 200
    wait_until(ready, 30, what="fault daemon ready")
    return proc, url


@pytest.mark.integration
def test_xid_79_reaches_npd_and_nvsentinel_from_a_real_daemon(tmp_path, connector):
    d, url = fault_daemon(tmp_path, ["--xid", "79", "--xid", "13"],
                          socket_path=connector.path)
    try:
        conditions, events = npd_pass(url)
        status, message = conditions["GpuwatchGpuUnhealthy"]
        assert status == "True" and message.startswith("XID_79: GPU 0 (GPU-fake-0): XID 79")
        assert "reboot_node" in message
        assert conditions["GpuwatchGpuMemoryPressure"][0] == "False"
        assert [(r, m.split(":")[0]) for r, m in events] == [("GpuwatchGpuWarning", "XID_13")]
        wait_until(lambda: len(connector.unhealthy()) >= 2, 20, what="health events")
    finally:
        d.stop()
    fatal = [e for e in connector.unhealthy() if e.isFatal]
    (xid79,) = fatal
    assert (xid79.checkName, list(xid79.errorCode), xid79.agent) == (
        "GpuwatchGpuUnhealthy", ["XID_79"], "gpuwatch")
    assert pb.RecommendedAction.Name(xid79.recommendedAction) == "RESTART_BM"
    assert xid79.nodeName == "gpu-node-7" and xid79.componentClass == "GPU"
    assert {(e.entityType, e.entityValue) for e in xid79.entitiesImpacted} >= {
        ("GPU", "0"), ("GPU_UUID", "GPU-fake-0")}
    assert pb.ProcessingStrategy.Name(xid79.processingStrategy) == "EXECUTE_REMEDIATION"
    (xid13,) = [e for e in connector.unhealthy() if not e.isFatal]
    assert list(xid13.errorCode) == ["XID_13"]
    assert pb.RecommendedAction.Name(xid13.recommendedAction) == "CUSTOM"
    assert xid13.customRecommendedAction == "RESTART_APP"
    # a healthy baseline for everything without a finding (clears a previous run's state)
    healthy = {(e.checkName, e.entitiesImpacted[-1].entityValue) for e in connector.events
               if e.isHealthy}
    assert healthy == {("GpuwatchGpuUnhealthy", "GPU-fake-1"),
                       ("GpuwatchGpuMemoryPressure", "GPU-fake-0"),
                       ("GpuwatchGpuMemoryPressure", "GPU-fake-1")}
    # each once: the daemon ticked many times while it ran
    assert len(connector.events) == 5


@pytest.mark.integration
def test_lost_gpu_and_uncorrectable_ecc_reach_npd_and_nvsentinel_from_a_real_daemon(
        tmp_path, connector):
    """The fake driver's other faults: GPU 1 fallen off the bus, uncorrectable ECC errors."""
    d, url = fault_daemon(tmp_path, ["--lost", "--ecc-uncorrected", "2"],
                          socket_path=connector.path)
    try:
        seen: list = []

        def ecc_read():  # ECC totals come with the slow tier's first read, a tick or two in
            seen[:] = npd_pass(url)
            return seen[0]["GpuwatchGpuUnhealthy"][1].startswith("ECC_UNCORRECTABLE")

        wait_until(ecc_read, 20, what="the slow tier's first read")
        conditions, events = seen
        status, message = conditions["GpuwatchGpuUnhealthy"]
        assert status == "True" and message.startswith("ECC_UNCORRECTABLE: GPU 0 (GPU-fake-0)")
        assert message.endswith("(+1 more)") and events == []
        assert conditions["GpuwatchGpuMemoryPressure"][0] == "False"
        wait_until(lambda: len(connector.unhealthy()) >= 2, 20, what="health events")
    finally:
        d.stop()
    got = {(e.entitiesImpacted[-1].entityValue, tuple(e.errorCode)):
           (e.isFatal, pb.RecommendedAction.Name(e.recommendedAction))
           for e in connector.unhealthy()}
    assert got == {("GPU-fake-0", ("ECC_UNCORRECTABLE",)): (True, "COMPONENT_RESET"),
                   ("GPU-fake-1", ("GPU_LOST",)): (True, "RESTART_BM")}
    assert all(e.checkName == "GpuwatchGpuUnhealthy" for e in connector.unhealthy())


@pytest.mark.integration
def test_critical_time_to_oom_reaches_npd_and_nvsentinel_from_a_real_daemon(tmp_path,
                                                                              connector):
    # 10x clock, 0.3 s ticks: 3 s apart on the daemon's clock, the rate the leak detector
    # samples at; the simulated 64 MiB/s leak is judged critical within its first minutes
    d, url = fault_daemon(tmp_path, ["--clock", "10"], "--simulate", "leak",
                          socket_path=connector.path,
                          env={"GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "0.3"})
    rule = next(r for r in MONITOR["rules"] if r.get("condition") == "GpuwatchGpuMemoryPressure")
    try:
        got = {}

        def pressure():
            got["r"] = run_rule(rule, url)
            return got["r"][0] == "NonOK"
        wait_until(pressure, 90, interval=1.0, what="memory-pressure NonOK")
        assert got["r"][1].startswith("TIME_TO_OOM_CRITICAL: GPU 0")
        gpu_rule = next(r for r in MONITOR["rules"] if r.get("condition")
                        == "GpuwatchGpuUnhealthy")
        assert run_rule(gpu_rule, url)[0] == "OK"

        def delivered():
            return [e for e in connector.unhealthy()
                    if list(e.errorCode) == ["TIME_TO_OOM_CRITICAL"]]
        wait_until(delivered, 20, what="memory-pressure health event")
    finally:
        d.stop()
    (ev,) = delivered()
    assert ev.checkName == "GpuwatchGpuMemoryPressure" and not ev.isFatal
    assert pb.RecommendedAction.Name(ev.recommendedAction) == "CUSTOM"
    assert ev.customRecommendedAction == "RESTART_APP" and "runs out in" in ev.message
    assert ev.metadata["gpuwatch_action"] == "restart_app"


def test_npd_honours_its_timeout_and_says_why(tmp_path):
    """A daemon that accepts and never answers: the plugin answers 'unknown' itself before
    NPD's timeout would kill it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        r = subprocess.run([str(GPUWATCH), "npd", "gpu-health", "--url", url, "--timeout", "1"],
                           capture_output=True, text=True, timeout=npd.NPD_TIMEOUT_SECONDS,
                           env=child_env())
    finally:
        listener.close()
    assert r.returncode == npd.UNKNOWN
    (line,) = r.stdout.splitlines()
    assert line.startswith("gpuwatch npd gpu-health:") and ("timed out" in line
                                                            or "no answer within" in line)
    # misuse is unknown too, never a traceback
    r = subprocess.run([str(GPUWATCH), "npd", "gpu-health", "--url", "ftp://x"],
                       capture_output=True, text=True, timeout=30, env=child_env())
    assert r.returncode == 2 and "Traceback" not in r.stderr


# -- the publisher against the connector, in process ----------------------------------------

def gpu(**kw) -> GpuSample:
    return GpuSample(index=0, uuid="GPU-a", pci_bus_id="00000000:18:00.0", **kw)


def drain(pub: Publisher, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while pub._future is not None or pub.pending:
        pub._send_due()
        if time.monotonic() > deadline:
            raise AssertionError(pub.status.reason)
        time.sleep(0.02)


def test_publisher_sends_changes_once_and_clears_with_healthy_events(connector):
    pub = Publisher(NvSentinelConfig(enabled=True, socket=str(connector.path)),
                    SourceStatus(), "node-a")
    try:
        sig = {"GPU-a": GpuSignals(time_to_oom_severity=0)}
        pub.update([gpu()], sig, 1000.0)
        drain(pub)
        assert [(e.checkName, e.isHealthy) for e in connector.events] == [
            ("GpuwatchGpuUnhealthy", True), ("GpuwatchGpuMemoryPressure", True)]
        bad = gpu(remapped_rows_pending=True, xid_events_total={"48": 1})
        for t in (1002.0, 1004.0, 1006.0):
            pub.update([bad], sig, t)
        drain(pub)
        new = connector.events[2:]
        assert sorted((e.errorCode[0], pb.RecommendedAction.Name(e.recommendedAction),
                       e.isFatal) for e in new) == [
            ("ROW_REMAP_PENDING", "COMPONENT_RESET", True), ("XID_48", "COMPONENT_RESET", True)]
        assert new[0].nodeName == "node-a"
        pub.update([gpu(xid_events_total={"48": 1})], sig, 1008.0)  # the remap was applied
        drain(pub)
        (cleared,) = connector.events[4:]
        assert cleared.isHealthy and list(cleared.errorCode) == ["ROW_REMAP_PENDING"]
        assert pub.status.up and pub.status.errors_total == 0
    finally:
        pub.close()


def test_publisher_keeps_what_it_could_not_deliver_and_retries(tmp_path):
    path = tmp_path / "pc.sock"
    pub = Publisher(NvSentinelConfig(enabled=True, socket=str(path), timeout_seconds=2),
                    SourceStatus(), "node-a")
    try:
        pub.update([gpu(lost=True)], {}, 1000.0)
        settle(pub)
        assert not pub.status.up and "no platform-connector socket" in pub.status.reason
        assert len(pub.pending) == 2
        pc = PlatformConnector(path, fail=1)  # up, but refusing once
        try:
            pub._send_due()
            settle(pub)
            assert "UNAVAILABLE" in pub.status.reason and len(pub.pending) == 2
            drain(pub)
            assert [list(e.errorCode) for e in pc.events] == [["GPU_LOST"], []]
            assert pb.RecommendedAction.Name(pc.events[0].recommendedAction) == "RESTART_BM"
            assert pub.status.up
        finally:
            pc.stop()
        # bounded: a connector that never comes back costs at most MAX_PENDING events
        for i in range(400):
            pub._queue({"n": i})
        assert len(pub.pending) == 256 and pub.dropped > 0
    finally:
        pub.close()


def settle(pub: Publisher) -> None:
    """Wait for the delivery in flight and take its outcome, without starting another."""
    if pub._future is not None:
        pub._sent(*pub._future.result(timeout=10))
        pub._future = None
