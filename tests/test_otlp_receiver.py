"""OTLP in a real receiver (Debian 13's VictoriaMetrics, its OTLP/HTTP endpoint, queried by
PromQL): the semantic conventions' translated names, the same values as /metrics on the same
tick, the gen_ai.server.* histograms with /metrics' buckets; a reload starts and stops the
push."""

from __future__ import annotations

import math
import time

import pytest

from tests.helpers import wait_until
from tests.realservers.victoria_metrics import VictoriaMetrics
from tests.test_series_budget import parse

pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2",
                    reason="the [otlp] extra (opentelemetry-proto) is not installed")


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
        _histograms_match(d, prom)
    finally:
        prom.stop()


def _histograms_match(d, prom) -> None:
    """gen_ai.server.* arrive as histograms on the conventions' boundaries, their buckets
    /metrics' own at those bounds (layout bounds for TTFT and TPOT) on the same engine
    scrape, whole requests."""
    from gpuwatch.otlp.encode import GEN_AI_BUCKETS

    pairs = {"ttft": ("gen_ai_server_time_to_first_token_seconds",
                      "gpuwatch_engine_time_to_first_token_seconds"),
             "itl": ("gen_ai_server_time_per_output_token_seconds",
                     "gpuwatch_engine_inter_token_latency_seconds")}

    def both() -> dict | None:
        out = {}
        for sli, (pushed, family) in pairs.items():
            want = {float(lab["le"]): v for n, lab, v in parse(d.metrics())
                    if n == family + "_bucket"}
            got = {float(s["metric"]["le"]): float(s["value"][1])
                   for s in prom.query(pushed + "_bucket")}
            count = prom.query(pushed + "_count")
            if not want or not got or not count:
                return None
            out[sli] = want, got, float(count[0]["value"][1])
        return out

    def agree():
        seen = both()
        if seen is None:
            return None
        for sli, (want, got, count) in seen.items():
            bounds = [*GEN_AI_BUCKETS[sli][2], math.inf]
            if sorted(got) != bounds or count != round(want[math.inf]):
                return None  # a newer engine scrape on one side: read both again
            if any(got[b] != round(want[b]) for b in bounds):
                return None
        return seen
    seen = wait_until(agree, 30, what="pushed gen_ai histograms equal to /metrics' buckets")
    assert all(count > 0 for _, _, count in seen.values()), seen


def _sel(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""

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
