"""OTLP push: semantic-convention names in a real receiver (Debian 13's VictoriaMetrics, its
OTLP/HTTP endpoint, queried by PromQL), the same values as /metrics on the same tick; a receiver
that is down or slow costs a bounded queue and one log line per interval, never the tick;
retryable failures back off, refusals drop the request."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time

import pytest

from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.budget import Selection
from gpuwatch.signals.derived import Derived, GpuSignals
from tests.helpers import http_get, wait_until
from tests.test_series_budget import parse

pb = pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2",
                         reason="the [otlp] extra (opentelemetry-proto) is not installed")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
)

from gpuwatch.otlp.encode import Encoder  # noqa: E402


class VictoriaMetrics:
    """Debian 13's victoria-metrics on loopback: OTLP in, PromQL out."""

    def __init__(self, workdir):
        from tests.helpers import Proc, free_port
        from tests.realservers import trixie

        try:
            binary = str(trixie.victoria_metrics())
        except trixie.Unavailable as exc:
            if os.environ.get("CI") == "true":
                raise
            pytest.skip(f"Debian 13's VictoriaMetrics: {exc}")
        self.url = f"http://127.0.0.1:{free_port()}"
        d = workdir / "victoria-metrics"
        d.mkdir()
        # -search.latencyOffset=0: a sample is queryable as soon as it is flushed, not 30 s on
        self.proc = Proc([binary, f"-storageDataPath={d / 'data'}",
                          f"-httpListenAddr={self.url.removeprefix('http://')}",
                          "-opentelemetry.usePrometheusNaming", "-search.latencyOffset=0s",
                          "-search.disableCache", "-loggerLevel=WARN"], d, "victoria-metrics")
        wait_until(lambda: http_get(self.url + "/health", 1.0)[0] == 200, 30,
                   what="victoria-metrics ready")
        self.otlp = f"{self.url}/opentelemetry/v1/metrics"

    def api(self, path: str, **params):
        import json
        import urllib.parse

        http_get(self.url + "/internal/force_flush", 5.0)
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        _, body = http_get(url, 10.0)
        data = json.loads(body)
        assert data.get("status") == "success", (path, params, data)
        return data["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        self.proc.stop()


# -- the encoder ---------------------------------------------------------------------------

def _decode(body: bytes) -> dict[str, list]:
    req = ExportMetricsServiceRequest.FromString(body)
    out: dict[str, list] = {}
    for rm in req.resource_metrics:
        res = {a.key: a.value.string_value for a in rm.resource.attributes}
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).append((res, m))
    return out


def _snap(t: float, tto_severity: int = 0, used: int = 40 << 30, version: int = 1,
          ecc: int = 0) -> Snapshot:
    gpu = GpuSample(index=0, uuid="GPU-1", name="NVIDIA H200", memory_total_bytes=80 << 30,
                    memory_used_bytes=used, utilization_ratio=0.5,
                    ecc_volatile_corrected_total=ecc,
                    processes=[ProcessSample(pid=7, name="vllm", used_memory_bytes=used,
                                             namespace="serving", pod="llama-0",
                                             container="vllm"),
                               ProcessSample(pid=8, name="idle", used_memory_bytes=1)])
    d = Derived()
    d.gpus["GPU-1"] = GpuSignals(time_to_oom_severity=tto_severity, time_to_oom_seconds=900.0,
                                 leak_rate_bytes_per_second=1e6, leak_severity=tto_severity)
    d.budget = Selection(exported=frozenset({("GPU-1", 7)}), folded={"GPU-1": 1})
    return Snapshot(version=version, tick=Tick(t=t, gpus=[gpu]), derived=d, started=t - 100)


def test_hw_status_predicted_failure_carries_the_time_to_oom_verdict():
    enc = Encoder("host-a")
    for severity, state in ((0, "ok"), (1, "predicted_failure"), (2, "predicted_failure")):
        status = _decode(enc.encode(_snap(1000.0, severity)))["hw.status"][0][1]
        on = {a.value.string_value for p in status.sum.data_points if p.as_double == 1
              for a in p.attributes if a.key == "hw.state"}
        assert on == {state}, severity
        assert not status.sum.is_monotonic


def test_resources_name_the_host_and_the_pod_and_only_budgeted_processes():
    got = _decode(Encoder("host-a", node_name="node-7").encode(_snap(1000.0)))
    (res, usage), = got["gpuwatch.process.gpu.memory.usage"]
    assert res["host.name"] == "host-a" and res["k8s.node.name"] == "node-7"
    assert (res["k8s.namespace.name"], res["k8s.pod.name"], res["k8s.container.name"]) == (
        "serving", "llama-0", "vllm")
    pids = [a.value.int_value for p in usage.sum.data_points for a in p.attributes
            if a.key == "process.pid"]
    assert pids == [7]  # the folded process is counted, not exported
    gpu_res = got["hw.gpu.memory.usage"][0][0]
    assert "k8s.pod.name" not in gpu_res
    assert got["gpuwatch.gpu.processes.folded"][0][1].sum.data_points[0].as_double == 1


def test_a_hostile_process_name_is_sent_and_an_unowned_process_joins_the_host_resource():
    snap = _snap(1000.0)
    gpu = snap.tick.gpus[0]
    gpu.processes.append(ProcessSample(pid=9, name="bad\udcff\u00e9name", used_memory_bytes=5))
    snap.derived.budget = Selection(exported=frozenset({("GPU-1", 7), ("GPU-1", 9)}),
                                    folded={"GPU-1": 1})
    req = ExportMetricsServiceRequest.FromString(Encoder("host-a").encode(snap))
    assert len(req.resource_metrics) == 2  # the host's (GPUs, pid 9) and the pod's (pid 7)
    host = req.resource_metrics[0]
    usage = next(m for m in host.scope_metrics[0].metrics
                 if m.name == "gpuwatch.process.gpu.memory.usage")
    p, = usage.sum.data_points
    names = {a.key: a.value.string_value for a in p.attributes}
    assert names["process.executable.name"] == "bad?\u00e9name" and p.as_double == 5
    assert "hw.gpu.memory.usage" in {m.name for m in host.scope_metrics[0].metrics}


def test_delta_temporality_sends_changes_cumulative_sends_totals():
    for delta, expect in ((False, [3.0, 5.0, 2.0]), (True, [3.0, 2.0, 2.0])):
        enc = Encoder("h", delta=delta)
        values, starts = [], []
        for k, ecc in enumerate((3, 5, 2)):  # 5 -> 2: a reset (the driver reloaded)
            m = next(m for _, m in _decode(enc.encode(_snap(1000.0 + k, ecc=ecc)))["hw.errors"])
            p = next(p for p in m.sum.data_points
                     if any(a.value.string_value == "corrected" for a in p.attributes))
            values.append(p.as_double)
            starts.append(p.start_time_unix_nano)
            assert m.sum.aggregation_temporality == (
                pb.AGGREGATION_TEMPORALITY_DELTA if delta else
                pb.AGGREGATION_TEMPORALITY_CUMULATIVE)
            assert m.sum.is_monotonic
        assert values == expect, delta
        if delta:  # each change starts where the last ended; after a reset, at the start
            assert starts[1] == round(1000.0 * 1e9) and starts[2] == round((1002.0 - 100) * 1e9)
    # up-down counters stay cumulative in delta mode (the SDKs' delta preference)
    usage = _decode(Encoder("h", delta=True).encode(_snap(1000.0)))["hw.gpu.memory.usage"]
    assert usage[0][1].sum.aggregation_temporality == pb.AGGREGATION_TEMPORALITY_CUMULATIVE


def test_gen_ai_histograms_on_the_recommended_buckets():
    layout = pytest.importorskip(
        "gpuwatch.exposition.layout",
        reason="gpuwatch's one bucket layout for engine latencies (the serving work) has not "
               "landed: no engine histograms to map onto gen_ai.server.*")
    from gpuwatch.otlp.encode import GEN_AI_BUCKETS
    from gpuwatch.signals.derived import EngineState

    bounds = layout.BOUNDS
    # 100 requests, uniform over the first half second: cumulative counts on gpuwatch's layout
    cum = [min(b / 0.5, 1.0) * 100 for b in bounds] + [100.0]
    st = EngineState(name="vllm-0", kind="vllm", model="m", up=True)
    st.sli_buckets = {"ttft": cum}
    st.sli_seconds_total = {"ttft": 25.0}
    snap = _snap(1000.0)
    snap.derived.engines["vllm-0"] = st
    (_res, m), = _decode(Encoder("h").encode(snap))["gen_ai.server.time_to_first_token"]
    p, = m.histogram.data_points
    assert list(p.explicit_bounds) == list(GEN_AI_BUCKETS["ttft"][2]) and m.unit == "s"
    assert p.count == 100 and sum(p.bucket_counts) == 100 and p.sum == 25.0
    assert p.bucket_counts[list(p.explicit_bounds).index(0.25)] == round(
        (0.25 - 0.1) / 0.5 * 100)
    attrs = {a.key: a.value.string_value for a in p.attributes}
    assert attrs["gen_ai.request.model"] == "m" and attrs["gen_ai.provider.name"] == "vllm"


# -- delivery: backoff, refusals, partial success (a real HTTP server, a clock we move) ------

class Receiver:
    """An aiohttp server on loopback answering each push with the next scripted answer."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.bodies: list[bytes] = []

    async def handle(self, request):
        from aiohttp import web

        self.bodies.append(await request.read())  # aiohttp undoes a Content-Encoding: gzip
        self.headers = dict(request.headers)
        status, headers, body = self.answers.pop(0) if self.answers else (200, {}, b"")
        return web.Response(status=status, headers=headers, body=body)


def _deliver(answers, rounds: int, cfg: dict | None = None, fresh=True):
    """Run `rounds` push intervals against a Receiver; (receiver, pusher, clock times of the
    pushes the receiver saw)."""
    import aiohttp
    from aiohttp import web

    from gpuwatch.otlp.config import OtlpConfig
    from gpuwatch.otlp.push import OtlpPusher

    recv = Receiver(answers)
    seen: list[float] = []
    now = [0.0]

    async def main():
        app = web.Application()

        async def handle(request):
            seen.append(now[0])
            return await recv.handle(request)

        app.router.add_post("/v1/metrics", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        conf = OtlpConfig(endpoint=f"http://127.0.0.1:{port}/v1/metrics", interval_seconds=10,
                          timeout_seconds=5, max_backoff_seconds=40, max_queued=3,
                          headers={"Authorization": "Bearer s3cret"}, **(cfg or {}))
        version = [0]

        def snapshot():
            if fresh:
                version[0] += 1
            return _snap(1000.0 + now[0], version=version[0])

        pusher = OtlpPusher(conf, snapshot, "h", clock=lambda: now[0])
        try:
            async with aiohttp.ClientSession(headers=pusher.headers()) as session:
                for k in range(rounds):
                    now[0] = k * 10.0
                    await pusher.once(session)
        finally:
            await runner.cleanup()
        return pusher

    pusher = asyncio.run(main())
    return recv, pusher, seen


def test_retryable_failures_back_off_doubling_then_deliver_oldest_first():
    unavailable = (503, {}, b"")
    recv, pusher, seen = _deliver([unavailable] * 4, rounds=20)
    # fails at 0, 10 (after 10 s), 30 (20 s), 70 (40 s, the cap); the cap holds: 110 succeeds
    assert seen[:5] == [0.0, 10.0, 30.0, 70.0, 110.0]
    assert pusher.counters["failed"] == 4 and pusher.counters["rejected"] == 0
    # the queue held 3 (the oldest dropped), then everything flowed again, oldest first
    assert pusher.counters["dropped"] >= 1 and pusher.counters["queued"] == 0
    stamps = [ExportMetricsServiceRequest.FromString(b).resource_metrics[0].scope_metrics[0]
              .metrics[0] for b in recv.bodies[4:]]
    times = [m.gauge.data_points[0].time_unix_nano if m.HasField("gauge") else
             m.sum.data_points[0].time_unix_nano for m in stamps]
    assert times == sorted(times) and len(times) == len(set(times))
    assert recv.headers["Authorization"] == "Bearer s3cret"
    assert recv.headers["Content-Encoding"] == "gzip"


def test_retry_after_is_honoured_within_the_cap():
    _recv, _pusher, seen = _deliver([(429, {"Retry-After": "25"}, b""),
                                   (429, {"Retry-After": "3600"}, b"")], rounds=12)
    assert seen[:3] == [0.0, 30.0, 70.0]  # 25 s (next interval: 30), then the 40 s cap


def test_a_refusal_drops_that_request_and_the_rest_still_go():
    _recv, pusher, seen = _deliver([(400, {}, b"bad request"), (200, {}, b"")], rounds=3)
    assert seen == [0.0, 10.0, 20.0]  # no backoff after a refusal
    assert pusher.counters["rejected"] == 1 and pusher.counters["pushed"] == 2
    assert pusher.counters["failed"] == 0 and pusher.counters["queued"] == 0


def test_partial_success_counts_the_rejected_points():
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceResponse,
    )

    answer = ExportMetricsServiceResponse()
    answer.partial_success.rejected_data_points = 7
    answer.partial_success.error_message = "out of order"
    _recv, pusher, _ = _deliver([(200, {"Content-Type": "application/x-protobuf"},
                                 answer.SerializeToString())], rounds=1)
    assert pusher.counters["pushed"] == 1 and pusher.counters["rejected_points"] == 7


def test_the_same_tick_is_pushed_once_and_uncompressed_when_asked():
    recv, _pusher, _seen = _deliver([], rounds=3, cfg={"compression": "none"}, fresh=False)
    assert len(recv.bodies) == 1 and "Content-Encoding" not in recv.headers
    ExportMetricsServiceRequest.FromString(recv.bodies[0])


# -- a real receiver -----------------------------------------------------------------------

OTLP_CONFIG = """
host_name = "otlp-host-1"
[nvml]
fast_interval_seconds = 1000.0
slow_interval_seconds = 0
[otlp]
endpoint = "{url}"
interval_seconds = 1.0
timeout_seconds = 1.0
"""
# (OTLP name, its Prometheus translation, the /metrics family it matches, label pairs)
MATCHES = [
    ("hw.gpu.memory.usage", "hw_gpu_memory_usage_bytes", "gpuwatch_gpu_memory_used_bytes", {}),
    ("hw.gpu.memory.limit", "hw_gpu_memory_limit_bytes", "gpuwatch_gpu_memory_total_bytes",
     {}),
    ("hw.gpu.utilization", "hw_gpu_utilization_ratio", "gpuwatch_gpu_utilization_ratio",
     {"hw_gpu_task": "general"}),
    ("gpuwatch.gpu.memory.zone", "gpuwatch_gpu_memory_zone", "gpuwatch_gpu_memory_zone", {}),
    ("gpuwatch.gpu.memory.leak_severity", "gpuwatch_gpu_memory_leak_severity",
     "gpuwatch_gpu_memory_leak_severity", {}),
]


@pytest.mark.integration
def test_otlp_lands_in_victoria_metrics_with_semconv_names(daemon, tmp_path):
    prom = VictoriaMetrics(tmp_path)
    try:
        d = daemon("--simulate", "mixed", config_toml=OTLP_CONFIG.format(url=prom.otlp))
        names = wait_until(lambda: (n := set(prom.api("label/__name__/values")))
                           >= {m[1] for m in MATCHES} and n, 30,
                           what="the pushed series in Prometheus")
        assert {"hw_gpu_memory_utilization_ratio", "hw_status", "hw_errors_total",
                "gpuwatch_process_gpu_memory_usage_bytes"} <= names, names
        state = d.state()
        tick_t = state["t"]
        body = parse(d.metrics())  # the daemon ticked once: this is that tick's exposition
        for _, translated, family, extra in MATCHES:
            want = {lab["uuid"]: v for n, lab, v in body if n == family}
            got = {s["metric"]["hw_id"]: float(s["value"][1])
                   for s in prom.query(f"{translated}{_sel(extra)}")}
            assert want and got == pytest.approx(want), translated
        # the samples carry the tick's own time
        for s in prom.query("timestamp(hw_gpu_memory_usage_bytes)"):
            assert abs(float(s["value"][1]) - tick_t) < 0.01
        procs = {lab["pid"]: v for n, lab, v in body
                 if n == "gpuwatch_process_gpu_memory_used_bytes" and lab["pid"]}
        got = {s["metric"]["process_pid"]: float(s["value"][1])
               for s in prom.query("gpuwatch_process_gpu_memory_usage_bytes")}
        assert got == pytest.approx(procs)
        ok = prom.query('hw_status{hw_state="ok"} == 1')
        assert len(ok) == len({lab["uuid"] for n, lab, _ in body
                               if n == "gpuwatch_gpu_memory_used_bytes"})
        # the resource's attributes label every series (this receiver has no target_info)
        for s in prom.query("hw_gpu_memory_usage_bytes"):
            assert s["metric"]["host_name"] == "otlp-host-1"
            assert s["metric"]["service_name"] == "gpuwatch"
            assert len(s["metric"]) <= 15, s["metric"]
        pushed = [v for n, _, v in parse(d.metrics()) if n == "gpuwatch_otlp_pushed_requests_total"]
        assert pushed and pushed[0] >= 1
    finally:
        prom.stop()


def _sel(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


@pytest.mark.integration
@pytest.mark.parametrize("receiver", ["slow", "down"])
def test_a_receiver_down_or_slow_costs_a_bounded_queue_never_the_tick(daemon, receiver):
    """slow: it accepts the connection and never answers; down: nothing listens."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if receiver == "slow":
        listener.listen(64)
    else:
        listener.close()
    try:
        d = daemon("--simulate", "mixed", config_toml=f"""
[nvml]
fast_interval_seconds = 0.5
[otlp]
endpoint = "http://127.0.0.1:{port}/v1/metrics"
interval_seconds = 1.0
timeout_seconds = 0.8
max_queued = 3
""")
        t0 = time.monotonic()
        first = d.state()["t"]
        time.sleep(7)
        elapsed = time.monotonic() - t0
        later = d.state()["t"]
        assert later - first > 0.6 * elapsed  # the daemon kept ticking at 0.5 s
        series = {n: v for n, _, v in parse(d.metrics()) if n.startswith("gpuwatch_otlp_")}
        assert series["gpuwatch_otlp_queued_requests"] <= 3
        assert series["gpuwatch_otlp_dropped_requests_total"] >= 1
        # retries back off (1, 2, 4 intervals): fewer attempts than intervals, but some
        assert 2 <= series["gpuwatch_otlp_failed_requests_total"] <= 5
        assert series["gpuwatch_otlp_pushed_requests_total"] == 0
        lines = [ln for ln in d.output().splitlines() if "OTLP push to" in ln]
        assert 1 <= len(lines) <= math.ceil(elapsed / 1.0) + 2, lines
        assert http_get(d.url + "/metrics", 2.0)[0] == 200
    finally:
        listener.close()


# -- configuration ---------------------------------------------------------------------------

def test_headers_and_endpoint_credentials_are_secrets():
    import json
    import tomllib

    from gpuwatch import redact
    from gpuwatch.config import _convert

    cfg = _convert(tomllib.loads("""
[otlp]
endpoint = "https://tenant:pa55word@otlp.example:4318/v1/metrics"
headers = { Authorization = "Bearer tok3n", X-Scope-OrgID = "team-a" }
"""), "test")
    shown = redact.config_for_display(cfg)["otlp"]
    assert shown["endpoint"] == "https://***@otlp.example:4318/v1/metrics"
    assert shown["headers"] == {"Authorization": "***", "X-Scope-OrgID": "***"}
    assert not {"pa55word", "tok3n"} & set(json.dumps(shown).split('"'))
    values = redact.secret_values(cfg)
    for text in ("sent Bearer tok3n", "POST https://tenant:pa55word@otlp.example:4318/v1"):
        assert not {"pa55word", "tok3n"} & set(redact.scrub_text(text, values).split()), text


@pytest.mark.parametrize("table, message", [
    ('endpoint = "collector:4318"', "http:// or https://"),
    ('endpoint = "http://c/v1/metrics"\ninterval_seconds = 5\ntimeout_seconds = 10',
     "must not exceed"),
    ('endpoint = "http://c/v1/metrics"\nheaders = { "X-A" = "a\\r\\nInjected: 1" }',
     "not a valid HTTP header"),
    ('endpoint = "http://c/v1/metrics"\nmax_queued = 0', "max_queued"),
    ('endpoint = "http://c/v1/metrics"\ntemporality = "sometimes"', "temporality"),
])
def test_bad_otlp_settings_are_refused_with_the_reason(table, message):
    import tomllib

    from gpuwatch.config import ConfigError, _convert

    with pytest.raises(ConfigError, match=message):
        _convert(tomllib.loads(f"[otlp]\n{table}\n"), "test")


def test_the_default_run_imports_no_otlp_code():
    import subprocess
    import sys

    code = ("import sys, gpuwatch.config, gpuwatch.daemon; "
            "print(sorted(m for m in sys.modules if 'opentelemetry' in m or 'google.protobuf' "
            "in m or m.startswith(('gpuwatch.otlp.push', 'gpuwatch.otlp.encode'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_an_endpoint_without_the_extra_stops_the_daemon_saying_what_to_install(tmp_path):
    """A plain module named opentelemetry hides the installed package, as on a host without
    the [otlp] extra."""
    from tests.helpers import REPO, Daemon

    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "opentelemetry.py").write_text("")
    d = Daemon(tmp_path, "--simulate", "mixed", wait_ready=False,
               env={"PYTHONPATH": os.pathsep.join((str(shadow), str(REPO)))},
               config_toml='[otlp]\nendpoint = "http://127.0.0.1:9/v1/metrics"\n')
    assert d.proc.wait(60) == 2
    assert "pip install 'gpuwatch-agent[otlp]'" in d.output()


@pytest.mark.integration
def test_a_reload_starts_and_stops_the_push(daemon, tmp_path):
    import signal

    prom = VictoriaMetrics(tmp_path)
    base = 'host_name = "reload-host"\n[nvml]\nfast_interval_seconds = 0.5\n'
    try:
        d = daemon("--simulate", "mixed", config_toml=base)
        cfg = next(tmp_path.glob("gpuwatch-*.toml"))

        def otlp_series():
            return {n: v for n, _, v in parse(d.metrics()) if n.startswith("gpuwatch_otlp_")}

        assert otlp_series() == {}
        cfg.write_text(base + f'[otlp]\nendpoint = "{prom.otlp}"\ninterval_seconds = 1.0\n'
                              'timeout_seconds = 1.0\n')
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: prom.query('hw_gpu_memory_usage_bytes{host_name="reload-host"}'),
                   30, what="pushes after the reload")
        cfg.write_text(base)
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: otlp_series() == {}, 30, what="the pusher gone after the reload")
        count = 'count_over_time(hw_gpu_memory_usage_bytes{host_name="reload-host"}[1h])'

        def samples():
            return sorted(float(s["value"][1]) for s in prom.query(count))

        before = samples()
        time.sleep(3)  # six ticks: none of them pushed
        assert samples() == before
    finally:
        prom.stop()
