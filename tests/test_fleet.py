"""A real fleet on one machine: 20 simulated hosts, each its own daemon with its own seed and
host name, in two clusters; each cluster's edge Prometheus (Debian's 2.42) scrapes its hosts
and remote-writes to one central Prometheus, which evaluates the shipped fleet rules
(alerts/gpuwatch.fleet.rules.yml). The Fleet dashboard's queries return data there, no
aggregation keeps a host's, process's or pod's label by accident, and the p99 TTFT per model
across hosts, from the histograms, is the fleet's (the seed picks each host's model and
load: two models, each on hosts from 0.4 to 3 times the default load).

Slow ticks (5 s) and a short leak window keep 20 daemons affordable on 2 cores."""

from __future__ import annotations

import json
import math
import time

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.monitoring import fleet_rules
from gpuwatch.monitoring.rule_base import RuleParams
from tests.helpers import REPO, Daemon, Prometheus, needs_binary, wait_until
from tests.test_monitoring_integration import FAST_SIGNALS

pytestmark = [pytest.mark.slow, pytest.mark.integration, needs_binary("prometheus")]

HOSTS = 20
CLUSTERS = ("eu-1", "us-2")
LEAKING = {3, 14}  # host numbers running the leak scenario; one per cluster
TTFT = "gpuwatch_engine_time_to_first_token_seconds"
CONFIG = FAST_SIGNALS + """
[nvml]
fast_interval_seconds = 5.0
slow_interval_seconds = 60.0
"""


def _host(n: int) -> str:
    return f"gpu-node-{n:02d}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    started = time.monotonic()
    procs: list = []
    try:
        daemons = []
        for n in range(HOSTS):
            scenario = "leak" if n in LEAKING else ("kubernetes" if n % 5 == 4 else "mixed")
            daemons.append(Daemon(work, "--simulate", scenario, "--seed", str(n + 1),
                                  "--host-name", _host(n), config_toml=CONFIG,
                                  wait_ready=False))
        procs += daemons
        for d in daemons:
            d.wait_ready(60)
        rules = work / fleet_rules.FLEET_RULES_FILE
        rules.write_text(yaml.safe_dump(fleet_rules.fleet_rules_document(RuleParams())))
        central = Prometheus(work, None, scrape_interval="5s", rule_files=[rules],
                             evaluation_interval="5s",
                             flags=("--web.enable-remote-write-receiver",))
        procs.append(central)
        half = HOSTS // len(CLUSTERS)
        edges = []
        for i, cluster in enumerate(CLUSTERS):
            mine = daemons[i * half:(i + 1) * half]
            edges.append(Prometheus(
                work, None, scrape_interval="5s",
                config={
                    "global": {"external_labels": {"cluster": cluster}},
                    # each host by its name, as a fleet's service discovery would label it
                    "scrape_configs": [{"job_name": "gpuwatch", "static_configs": [
                        {"targets": [d.address], "labels": {"instance": _host(i * half + k)}}
                        for k, d in enumerate(mine)]}],
                    "remote_write": [{"url": f"{central.url}/api/v1/write",
                                      "queue_config": {"batch_send_deadline": "1s"}}],
                }))
        procs += edges
        yield {"daemons": daemons, "central": central, "edges": edges, "started": started,
               "edges_started": time.monotonic()}
    finally:
        for p in reversed(procs):
            p.stop()
        print(f"fleet of {HOSTS} daemons: {time.monotonic() - started:.0f} s")


def _series(prom: Prometheus, expr: str) -> list[dict]:
    return prom.query(expr)


def test_fleet_rules_on_the_central_prometheus(fleet):
    central = fleet["central"]
    # every host arrives through its edge, named, in its cluster
    hosts = wait_until(lambda: (r := _series(central, "cluster:gpuwatch_hosts:count"))
                       and all(float(s["value"][1]) == HOSTS / len(CLUSTERS) for s in r)
                       and len(r) == len(CLUSTERS) and r, 90, interval=2,
                       what="every host counted on the central Prometheus")
    assert {s["metric"]["cluster"] for s in hosts} == set(CLUSTERS)
    names = {s["metric"]["instance"] for s in _series(central, "gpuwatch_up")}
    assert names == {_host(n) for n in range(HOSTS)}
    # the leaking host of each cluster is judged; the fleet rule counts its GPU once
    leaking = wait_until(
        lambda: (r := _series(central, "cluster:gpuwatch_gpus_with_leak_verdict:count"))
        and len(r) == len(CLUSTERS) and r, 150, interval=3, what="leak verdicts per cluster")
    assert all(float(s["value"][1]) >= 1 for s in leaking), leaking

    def judged_gpus() -> dict[str, float]:
        gpus = {(s["metric"]["cluster"], s["metric"]["instance"], s["metric"]["uuid"])
                for s in _series(central, "gpuwatch_gpu_memory_leak_severity >= 1 or "
                                          "gpuwatch_process_memory_leak_severity >= 1")}
        return {c: float(sum(1 for g in gpus if g[0] == c)) for c in CLUSTERS}

    def counted() -> dict[str, float]:
        return {s["metric"]["cluster"]: float(s["value"][1])
                for s in _series(central, "cluster:gpuwatch_gpus_with_leak_verdict:count")}
    # the rule counts each judged GPU once, however many of its processes are judged
    wait_until(lambda: counted() == judged_gpus(), 30, interval=2, what="the count per GPU")
    tto = {s["metric"]["cluster"]: float(s["value"][1])
           for s in _series(central, "cluster:gpuwatch_gpu_time_to_oom_seconds:min")}
    assert set(tto) == set(CLUSTERS) and all(0 < v < math.inf for v in tto.values()), tto
    # ... and it is the smallest of the hosts' own
    raw = {}
    for s in _series(central, "gpuwatch_gpu_time_to_oom_seconds"):
        c = s["metric"]["cluster"]
        raw[c] = min(raw.get(c, math.inf), float(s["value"][1]))
    assert all(abs(raw[c] - tto[c]) <= 0.1 * raw[c] + 30 for c in CLUSTERS), (raw, tto)
    per_host = _series(central, "cluster:gpuwatch_exposition_series_per_host:max")
    assert all(100 < float(s["value"][1]) < 1000 for s in per_host), per_host

    # no fleet aggregation keeps a host's, process's or pod's label by accident
    for rule in fleet_rules.recording(RuleParams()):
        assert not set(rule.keeps) & set(fleet_rules.HOST_LABELS), rule.record
        for s in _series(central, rule.record):
            extra = set(s["metric"]) - {"__name__", *rule.keeps}
            assert not extra, f"{rule.record} keeps {sorted(extra)}"

    # the Fleet dashboard's queries return data on the central Prometheus
    missing = []
    for title, expr in _fleet_dashboard_queries():
        end = time.time()
        result = central.api("query_range", query=expr, start=end - 60, end=end,
                             step=5)["result"]
        if not any(r["values"] for r in result):
            missing.append(f"{title}: {expr}")
    assert not missing, "Fleet dashboard queries without data on the central Prometheus:\n" \
        + "\n".join(missing)
    print(f"fleet test: data on the central Prometheus after "
          f"{time.monotonic() - fleet['started']:.0f} s")


def _fleet_dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads((REPO / "dashboards" / "gpuwatch-fleet.json").read_text())
    values = {"$job": "gpuwatch", "$instance": ".*", "$cluster": ".*", "$__rate_interval": "20s",
              "$__range": "1m"}
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in values.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, expr
            out.append((panel["title"], expr))
    assert len(out) > 15
    return out


def _quantile(q: float, buckets: dict[float, float]) -> float:
    """histogram_quantile over cumulative counts by upper bound, +Inf included."""
    pairs = sorted(buckets.items())
    rank = q * pairs[-1][1]
    lo, below = 0.0, 0.0
    for le, count in pairs:
        if count >= rank:
            if math.isinf(le):
                return lo
            return lo + (le - lo) * (rank - below) / max(count - below, 1e-12)
        lo, below = le, count
    return lo


def _host_buckets(daemon) -> dict[str, dict[float, float]]:
    """A host's own TTFT buckets per model, from its /metrics."""
    out: dict[str, dict[float, float]] = {}
    for fam in text_string_to_metric_families(daemon.metrics()):
        if fam.name != TTFT:
            continue
        for s in fam.samples:
            if s.name == f"{TTFT}_bucket":
                model = out.setdefault(s.labels["model"], {})
                le = float(s.labels["le"])
                model[le] = model.get(le, 0.0) + s.value
    return out


def test_fleet_p99_ttft_per_model_from_the_histograms(fleet):
    """Hosts serving one model at different loads (their seeds'): the shipped rules' p99 on
    the central Prometheus is the p99 of all hosts' buckets summed, and not the mean of the
    hosts' own p99s, which the test tells apart. Each host's load is steady, so its buckets
    since it started stand for any window, the rules' 5 minutes too; what is left between
    them is rate()'s extrapolation per host and the requests a window cuts (under 5 % in
    the simulation's windows of 100 s and more)."""
    central = fleet["central"]
    rec = {"model": f"model:{TTFT}:p99_rate5m", "cluster": f"cluster_model:{TTFT}:p99_rate5m"}
    # a window of 100 s and more at the rules (what the tolerance was measured for)
    wait_until(lambda: time.monotonic() - fleet["edges_started"] >= 100, 120, interval=2,
               what="100 s of scrapes")
    wait_until(lambda: len([s for s in _series(central, rec["model"])
                            if not math.isnan(float(s["value"][1]))]) == 2, 90, interval=3,
               what=f"{rec['model']} for both models")
    got = {kind: {tuple(s["metric"].get(k, "") for k in ("cluster", "model")):
                  float(s["value"][1]) for s in _series(central, r)}
           for kind, r in rec.items()}
    hosts = {n: _host_buckets(d) for n, d in enumerate(fleet["daemons"])}
    serving = {n: b for n, b in hosts.items() if b}
    models = {m for b in serving.values() for m in b}
    assert len(models) == 2 and len(serving) >= 14, (models, sorted(serving))

    def summed(ns, model) -> dict[float, float]:
        out: dict[float, float] = {}
        for n in ns:
            for le, v in serving[n].get(model, {}).items():
                out[le] = out.get(le, 0.0) + v
        return out

    tolerance = 0.1
    for model in sorted(models):
        mine = [n for n in serving if model in serving[n]]
        own = [_quantile(0.99, serving[n][model]) for n in mine]
        assert max(own) > 2 * min(own), (model, own)  # the hosts' distributions differ
        expected = _quantile(0.99, summed(mine, model))
        naive = sum(own) / len(own)
        fleet_p99 = got["model"][("", model)]
        print(f"{model}: {len(mine)} hosts, fleet p99 {fleet_p99:.3f} s on the central, "
              f"{expected:.3f} s from the summed buckets, mean of the hosts' p99 "
              f"{naive:.3f} s, hosts {min(own):.2f} to {max(own):.2f} s")
        assert abs(fleet_p99 - expected) <= tolerance * expected, (model, fleet_p99, expected)
        # the mean of the hosts' p99s would fail the same check: the test tells them apart
        assert abs(naive - expected) > tolerance * expected, (model, naive, expected)
        for i, cluster in enumerate(CLUSTERS):
            half = HOSTS // len(CLUSTERS)
            theirs = [n for n in mine if i * half <= n < (i + 1) * half]
            want = _quantile(0.99, summed(theirs, model))
            have = got["cluster"][(cluster, model)]
            assert abs(have - want) <= tolerance * want, (cluster, model, have, want)
