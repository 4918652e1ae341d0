"""Serving-SLO alerts and the per-model serving row follow RuleParams."""

from __future__ import annotations

import json

import pytest

from gpuwatch.monitoring import dashboards, rules
from tests.helpers import wait_until


def test_serving_objectives_come_from_the_parameters():
    p = rules.RuleParams(ttft_slo_seconds=0.8, e2e_slo_seconds=12, error_ratio_max=0.01,
                         sli_quantile="0.99")
    text = rules.render(p)[rules.ALERTS_FILE]
    assert ('gpuwatch_engine_time_to_first_token_seconds{job="gpuwatch",quantile="0.99"} '
            '> 0.8\n') in text
    assert 'gpuwatch_engine_e2e_request_latency_seconds{job="gpuwatch",quantile="0.99"} > 12' \
        in text
    assert 'ratio_rate5m{job="gpuwatch"} > 0.01\n' in text
    default = rules.render(rules.RuleParams())[rules.ALERTS_FILE]
    assert 'quantile="0.95"} > 2\n' in default and 'quantile="0.95"} > 60\n' in default
    with pytest.raises(ValueError, match="sli_quantile"):
        rules.RuleParams(sli_quantile='0.9"} or vector(1) #')


def test_the_engines_dashboard_has_a_serving_row_per_model():
    p = rules.RuleParams(ttft_slo_seconds=0.8, error_ratio_max=0.01)
    dash = json.loads(dashboards.to_json(dashboards.inference_engines(p)))
    rows = [x for x in dash["panels"] if x["type"] == "row"]
    serving = [x for x in rows if x.get("repeat") == "model"]
    assert len(serving) == 1 and "$model" in serving[0]["title"]
    after = dash["panels"][dash["panels"].index(serving[0]) + 1:]
    by_title = {x["title"]: x for x in after}
    assert {"Time to first token", "Inter-token latency", "End-to-end request latency",
            "Token throughput", "Finished requests by reason", "Error ratio",
            "Waiting requests by reason"} <= set(by_title)

    def red_line(panel):
        steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
        return [s["value"] for s in steps if s["color"] == "red"]

    assert red_line(by_title["Time to first token"]) == [0.8]
    assert red_line(by_title["Error ratio"]) == [0.01]
    expr = by_title["Time to first token"]["targets"][0]["expr"]
    assert 'quantile=~"0.5|0.95|0.99"' in expr and "_mean_seconds" in expr
    assert 'reason="error"' in by_title["Error ratio"]["targets"][0]["expr"]


@pytest.mark.integration
def test_a_real_prometheus_fires_the_serving_alerts_from_the_simulated_engine(
        daemon, prometheus, tmp_path):
    from tests.test_monitoring_integration import _rule_files

    # objectives the simulated vLLM (p95 TTFT ~2 s, E2E ~15 s) misses by far
    p = rules.RuleParams(ttft_slo_seconds=0.05, e2e_slo_seconds=0.5)
    d = daemon("--simulate", "mixed")
    prom = prometheus([d.address], rule_files=_rule_files(tmp_path, pending="5s", p=p))
    prom.wait_for('up{job="gpuwatch"} == 1', timeout=30)
    ttft = prom.wait_for('gpuwatch_engine_time_to_first_token_seconds{quantile="0.95"}',
                         timeout=60)
    assert 0.05 < float(ttft[0]["value"][1]) < 60

    def firing():
        names = {a["labels"]["alertname"] for a in prom.alerts() if a["state"] == "firing"}
        want = {"GpuwatchTimeToFirstTokenHigh", "GpuwatchEndToEndLatencyHigh"}
        return want if want <= names else None

    wait_until(firing, 120, interval=2, what="the serving alerts to fire")
    alert = next(a for a in prom.alerts()
                 if a["labels"]["alertname"] == "GpuwatchTimeToFirstTokenHigh")
    assert alert["labels"]["quantile"] == "0.95" and alert["labels"]["kind"] == "vllm"
    assert "above the 0.05 s objective" in alert["annotations"]["description"]
    # the error ratio's recording rules evaluate (the simulated engine fails one request
    # every 2 minutes, so the ratio is a number, usually 0)
    ratio = prom.wait_for("instance_engine:gpuwatch_engine_request_error:ratio_rate5m",
                          timeout=60)
    assert 0 <= float(ratio[0]["value"][1]) <= 1
