"""A real fleet on one machine: 20 simulated hosts, each its own daemon with its own seed and
host name, in two clusters; each cluster's edge Prometheus (Debian's 2.42) scrapes its hosts
and remote-writes to one central Prometheus, which evaluates the shipped fleet rules
(alerts/gpuwatch.fleet.rules.yml). The Fleet dashboard's queries return data there, and no
aggregation keeps a host's, process's or pod's label by accident.

Slow ticks (5 s) and a short leak window keep 20 daemons affordable on 2 cores."""

from __future__ import annotations

import json
import math
import time

import pytest
import yaml

from gpuwatch.monitoring import fleet_rules
from gpuwatch.monitoring.rule_base import RuleParams
from tests.helpers import REPO, Daemon, Prometheus, http_get, needs_binary, wait_until
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
        yield {"daemons": daemons, "central": central, "edges": edges, "started": started}
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
        if TTFT in expr and not _ttft_exported(fleet):
            continue
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


def _ttft_exported(fleet) -> bool:
    _, body = http_get(fleet["daemons"][0].url + "/metrics")
    return f"{TTFT}_bucket" in body.decode()


def _quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """histogram_quantile over cumulative (le, count) pairs ending in +Inf."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    rank = q * total
    lo, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lo
            return lo + (le - lo) * (rank - below) / max(count - below, 1e-12)
        lo, below = le, count
    return lo


def test_fleet_p99_ttft_per_model_from_the_histograms(fleet):
    if not _ttft_exported(fleet):
        pytest.skip(f"the daemon exports no {TTFT}_bucket yet: the engine latency histograms "
                    "on gpuwatch's one bucket layout (the serving work, DESIGN.md section 2) "
                    "have not landed")
    central = fleet["central"]
    rec = "model:gpuwatch_engine_time_to_first_token_seconds:p99_rate5m"
    result = wait_until(lambda: [s for s in _series(central, rec)
                                 if not math.isnan(float(s["value"][1]))], 90, interval=3,
                        what=rec)
    # the same quantile from every host's own buckets, summed (the distribution is steady,
    # so the buckets since start stand for the last 5 minutes): within one bucket
    for s in result:
        model = s["metric"]["model"]
        summed: dict[float, float] = {}
        for d in fleet["daemons"]:
            for line in d.metrics().splitlines():
                if line.startswith(f"{TTFT}_bucket{{") and f'model="{model}"' in line:
                    le = line.split('le="')[1].split('"')[0]
                    summed[float(le)] = summed.get(float(le), 0.0) + float(line.split()[-1])
        bounds = sorted(summed)
        expected = _quantile(0.99, list(summed.items()))
        got = float(s["value"][1])
        i = next(k for k, b in enumerate(bounds) if b >= expected)
        lo = bounds[i - 2] if i >= 2 else 0.0
        hi = bounds[min(i + 1, len(bounds) - 1)]
        assert lo <= got <= hi, (model, got, expected)
