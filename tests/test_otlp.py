"""OTLP encoding and configuration: the semantic conventions' names, resources and
temporality in the request itself; secrets masked; bad settings refused; nothing of OTLP
imported by a default run. Delivery: test_otlp_delivery.py; a real receiver:
test_otlp_receiver.py."""

from __future__ import annotations

import os

import pytest

from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.budget import Selection
from gpuwatch.signals.derived import Derived, GpuSignals

pb = pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2",
                         reason="the [otlp] extra (opentelemetry-proto) is not installed")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
)

from gpuwatch.otlp.encode import Encoder  # noqa: E402

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


def _engine(cum: dict[str, list[float]], seconds: dict[str, float], **kw):
    from gpuwatch.signals.derived import EngineState

    st = EngineState(name="vllm-0", kind="vllm", model="m", up=True, **kw)
    st.sli_buckets, st.sli_seconds_total = cum, seconds
    return st


def _histograms(enc: Encoder, t: float, *engines) -> dict[str, list]:
    snap = _snap(t)
    for st in engines:
        snap.derived.engines[st.name] = st
    return {name: [p for _, m in ms for p in m.histogram.data_points]
            for name, ms in _decode(enc.encode(snap)).items() if name.startswith("gen_ai.")}


def test_gen_ai_histograms_on_the_recommended_buckets():
    from gpuwatch.exposition.layout import BOUNDS
    from gpuwatch.otlp.encode import GEN_AI_BUCKETS

    # 100 requests, uniform over the first half second: cumulative counts on gpuwatch's layout
    uniform = [min(b / 0.5, 1.0) * 100 for b in BOUNDS] + [100.0]
    st = _engine({"ttft": uniform, "itl": uniform, "e2e": uniform},
                 {"ttft": 25.0, "itl": 25.0, "e2e": 25.0})
    snap = _snap(1000.0)
    snap.derived.engines["vllm-0"] = st
    decoded = _decode(Encoder("h").encode(snap))
    for name, _, recommended in GEN_AI_BUCKETS.values():
        (_res, m), = decoded[name]
        p, = m.histogram.data_points
        assert list(p.explicit_bounds) == list(recommended) and m.unit == "s"
        assert m.histogram.aggregation_temporality == pb.AGGREGATION_TEMPORALITY_CUMULATIVE
        assert p.count == 100 and sum(p.bucket_counts) == 100 and p.sum == 25.0
        assert len(p.bucket_counts) == len(recommended) + 1
        attrs = {a.key: a.value.string_value for a in p.attributes}
        assert attrs["gen_ai.request.model"] == "m" and attrs["gen_ai.provider.name"] == "vllm"
        # each bucket holds what the layout's distribution puts between its bounds
        lower = [0.0, *recommended]
        for k, hi in enumerate(recommended):
            want = 100 * (min(hi, 0.5) - min(lower[k], 0.5)) / 0.5
            assert abs(p.bucket_counts[k] - want) <= 1, (name, hi, list(p.bucket_counts))
    # time to first token and time per output token: the conventions' boundaries are layout
    # bounds, so the buckets are the layout's own counts, summed
    for sli in ("ttft", "itl"):
        assert set(GEN_AI_BUCKETS[sli][2]) <= set(BOUNDS), sli


def test_gen_ai_histograms_count_whole_requests_per_model_and_temporality():
    from gpuwatch.exposition.layout import BOUNDS
    from gpuwatch.signals.derived import ModelSlis

    def model(n: float, early: float = 1 / 3) -> ModelSlis:
        """n requests, a share `early` at 0.3 s, the rest at 0.9 s (mapped engine buckets
        need not be whole)."""
        cum = [n * early * (b >= 0.3) + n * (1 - early) * (b >= 0.9) for b in BOUNDS] + [n]
        return ModelSlis(sli_buckets={"ttft": cum}, sli_seconds_total={"ttft": 0.7 * n})

    def points(enc: Encoder, t: float, st) -> dict[str, object]:
        return {next(a.value.string_value for a in p.attributes
                     if a.key == "gen_ai.request.model"): p
                for p in _histograms(enc, t, st)["gen_ai.server.time_to_first_token"]}

    for delta in (False, True):
        enc = Encoder("h", delta=delta)
        st = _engine({}, {}, models={"a": model(10.0), "b": model(7.0),
                                     "c": model(1.0, 0.5)})
        first = points(enc, 1000.0, st)
        st.models["a"] = model(30.0)
        second = points(enc, 1001.0, st)
        assert set(first) == set(second) == {"a", "b", "c"}
        for p in (*first.values(), *second.values()):  # whole requests, adding up
            assert sum(p.bucket_counts) == p.count, p
        # 7 requests: 2.33 at 0.3 s (bucket 0.25-0.5) and 4.67 at 0.9 s (0.75-1.0): 2 and 5
        b = first["b"]
        assert (b.count, b.bucket_counts[9], b.bucket_counts[11]) == (7, 2, 5)
        assert first["c"].count == 1  # half a request in each bucket is still one
        a = second["a"]
        if delta:  # the change since the last push, from its time
            assert (a.count, a.sum, second["b"].count) == (20, pytest.approx(14.0), 0)
            assert a.start_time_unix_nano == round(1000.0e9)
        else:  # totals since the process start
            assert (a.count, a.sum, second["b"].count) == (30, pytest.approx(21.0), 7)
            assert a.start_time_unix_nano == round((1001.0 - 100) * 1e9)  # the start


def test_no_gen_ai_histograms_from_a_down_or_ambiguous_engine():
    from gpuwatch.exposition.layout import BOUNDS

    buckets = {"ttft": [1.0] * len(BOUNDS) + [1.0]}
    assert _histograms(Encoder("h"), 1000.0, _engine(buckets, {"ttft": 0.1}))
    for kw in ({"up": False}, {"ambiguous": True}):
        st = _engine(buckets, {"ttft": 0.1})
        for k, v in kw.items():
            setattr(st, k, v)
        assert _histograms(Encoder("h"), 1000.0, st) == {}, kw

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
