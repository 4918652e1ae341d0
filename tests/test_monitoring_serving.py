"""Serving-SLO alerts and the per-model serving row follow RuleParams."""

from __future__ import annotations

import json
import math
import re

import pytest

from gpuwatch.monitoring import dashboards, rules
from tests.helpers import wait_until


def test_serving_objectives_come_from_the_parameters():
    p = rules.RuleParams(ttft_slo_seconds=0.5, e2e_slo_seconds=10, latency_objective=0.999,
                         availability_objective=0.995, slo_min_requests=50)
    text = rules.render(p)[rules.RULES_FILE] + rules.render(p)[rules.ALERTS_FILE]
    # the share under the objective is a bucket of gpuwatch's layout, not an interpolation
    assert 'gpuwatch_engine_time_to_first_token_seconds_bucket{job="gpuwatch",le="0.5"}' in text
    assert 'gpuwatch_engine_e2e_request_latency_seconds_bucket{job="gpuwatch",le="10.0"}' in text
    # 14.4 x a 0.1 % budget; 6 x a 0.5 % one; 50 requests in the short window
    assert "ttft_slow:ratio_rate1h" not in text  # named after the metric, as recorded
    assert "time_to_first_token_slow:ratio_rate1h{job=\"gpuwatch\"} > 0.0144\n" in text
    assert "request_errors:ratio_rate6h{job=\"gpuwatch\"} > 0.03\n" in text
    assert "requests:rate5m{job=\"gpuwatch\"} * 300 >= 50" in text
    with pytest.raises(ValueError, match=r"ttft_slo_seconds: 0\.7 s is not a bound"):
        rules.RuleParams(ttft_slo_seconds=0.7)
    with pytest.raises(ValueError, match="latency_objective"):
        rules.RuleParams(latency_objective=1.0)
    with pytest.raises(ValueError, match="sli_quantile"):
        rules.RuleParams(sli_quantile='0.9"} or vector(1) #')


def test_the_slo_alerts_are_per_model_and_keep_no_instance():
    for alert in rules.alert_groups(rules.RuleParams())["gpuwatch-engines"]:
        if alert.alert.endswith("BudgetBurn"):
            assert "sum by (job, model)" not in alert.expr and "on (job, model)" in alert.expr
    for r in rules.recording_rules(rules.RuleParams()):
        if r.record.startswith("model:"):
            assert set(re.findall(r"\bby \(([^)]*)\)", r.expr)) <= {"job, model"}, r.record


def test_the_engines_dashboard_has_a_serving_row_per_model():
    p = rules.RuleParams(ttft_slo_seconds=0.5, availability_objective=0.995)
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

    assert red_line(by_title["Time to first token"]) == [0.5]
    assert red_line(by_title["Error ratio"]) == [0.005]
    exprs = [t["expr"] for t in by_title["Time to first token"]["targets"]]
    assert 'quantile=~"0.5|0.95|0.99"' in exprs[0] and "_mean_seconds" in exprs[1]
    assert exprs[2].startswith("histogram_quantile(0.95, sum by (le)")
    errors = [t["expr"] for t in by_title["Error ratio"]["targets"]]
    assert 'outcome="error"' in errors[0] and 'reason="error"' in errors[1]


@pytest.mark.integration
def test_a_real_prometheus_fires_the_serving_alerts_from_the_simulated_engine(
        daemon, prometheus, tmp_path):
    from tests.test_monitoring_integration import _rule_files

    # objectives the simulated vLLM (p95 TTFT ~2 s, E2E ~15 s) misses by far
    p = rules.RuleParams(ttft_slo_seconds=0.05, e2e_slo_seconds=0.5)
    d = daemon("--simulate", "mixed")
    prom = prometheus([d.address], rule_files=_rule_files(tmp_path, pending="5s", p=p))
    prom.wait_for('up{job="gpuwatch"} == 1', timeout=30)
    ttft = prom.wait_for('gpuwatch_engine_time_to_first_token_window_seconds{quantile="0.95"}',
                         timeout=60)
    assert 0.05 < float(ttft[0]["value"][1]) < 60
    # the fleet-wide quantile from the histograms on gpuwatch's layout
    fleet = wait_until(lambda: [v for r in prom.query(
        "histogram_quantile(0.95, sum by (le, model) (rate("
        "gpuwatch_engine_time_to_first_token_seconds_bucket[1m])))")
        if math.isfinite(v := float(r["value"][1]))], 60, what="the fleet-wide TTFT p95")
    assert 0.05 < fleet[0] < 60

    def firing():
        names = {(a["labels"]["alertname"], a["labels"]["severity"])
                 for a in prom.alerts() if a["state"] == "firing"}
        want = {("GpuwatchTimeToFirstTokenBudgetBurn", "critical"),
                ("GpuwatchEndToEndLatencyBudgetBurn", "critical")}
        return want if want <= names else None

    wait_until(firing, 120, interval=2, what="the serving alerts to fire")
    alert = next(a for a in prom.alerts()
                 if a["labels"]["alertname"] == "GpuwatchTimeToFirstTokenBudgetBurn")
    assert set(alert["labels"]) == {"alertname", "severity", "job", "model"}
    assert "(99 % within 0.05 s)" in alert["annotations"]["description"]
    # the error ratio's recording rules evaluate (the simulated engine fails one request
    # every 2 minutes, so the ratio is a number, usually 0)
    ratio = prom.wait_for("instance_engine:gpuwatch_engine_request_error:ratio_rate5m",
                          timeout=60)
    assert 0 <= float(ratio[0]["value"][1]) <= 1
