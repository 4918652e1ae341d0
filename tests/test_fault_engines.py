"""Fault campaign against the engine path: a real daemon scrapes abusive endpoints (garbage,
slowloris, huge, gzip bomb, label churn, NaN/1e308, counters backwards, duplicate series,
replicas behind one URL) on loopback, next to a healthy engine. Bounded in time; asserts
liveness, bounded RSS and sane values. The /metrics latency beside a daemon that scrapes only
the healthy engine is measured in benchmarks/hostile_input_cost.py."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import Proc, child_env, wait_until

pytestmark = pytest.mark.slow

ABUSES = ("garbage", "prose", "huge", "bomb", "slowloris", "insane", "backwards",
          "duplicate", "replicas", "blind_replicas", "churn")
COUNTER_MAX = 2.0**53
MAX_QUEUE_SECONDS = 86400.0


@contextlib.contextmanager
def abusive_endpoints(tmp_path: Path):
    """The abusive endpoints' port."""
    port_file = tmp_path / "abusive.port"
    # Niced: the endpoints stand for remote hosts; their CPU is not the daemon's to share.
    proc = Proc(["nice", "-n", "10", sys.executable, "-m", "tests.abusive_engines",
                 str(port_file)], tmp_path, "abusive", env=child_env())
    try:
        wait_until(lambda: port_file.exists(), 60, what="the abusive endpoints")
        yield int(port_file.read_text())
    finally:
        proc.stop()


@pytest.fixture
def abusive(tmp_path):
    with abusive_endpoints(tmp_path) as port:
        yield port


def config(port: int, paths, interval: float = 1.0) -> str:
    out = ["[nvml]", "fast_interval_seconds = 1.0", ""]
    for path in ("healthy", *paths):
        out += ["[[engines]]", f'name = "{path}"', f'url = "http://127.0.0.1:{port}/{path}"',
                f"interval_seconds = {interval}", "timeout_seconds = 2.0",
                'kind = "vllm"' if path != "garbage" else 'kind = "auto"',
                "max_body_bytes = 16777216", ""]
    return "\n".join(out)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def children_rss_mib(pid: int) -> float:
    """RSS of the daemon's child processes (the engine body readers)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError, AssertionError):
                total += rss_mib(int(child))
    return total


class Watch:
    """Polls /metrics (latency) and /api/state (health, values, RSS) of a running daemon."""

    def __init__(self, d) -> None:
        self.d = d
        self.conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
        self.latencies: list[float] = []
        self.rss: list[tuple[float, float]] = []
        self.children_rss: list[float] = []
        self.states: list[dict] = []
        self.state_bytes = 0

    def get(self, path: str) -> bytes:
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        body = resp.read()
        assert resp.status == 200, (path, resp.status)
        return body

    def run(self, seconds: float, every: float = 0.05, state_every: float = 2.0) -> None:
        """/metrics every `every` s; RSS every 2 s; /api/state every `state_every` s."""
        t0 = time.monotonic()
        next_rss = next_state = t0
        while (now := time.monotonic()) - t0 < seconds:
            assert self.d.alive(), self.d.output()[-3000:]
            start = time.perf_counter()
            self.get("/metrics")
            self.latencies.append(time.perf_counter() - start)
            if now >= next_rss:
                self.rss.append((now - t0, rss_mib(self.d.proc.pid)))
                self.children_rss.append(children_rss_mib(self.d.proc.pid))
                next_rss += 2.0
            if now >= next_state:
                body = self.get("/api/state")
                self.state_bytes = max(self.state_bytes, len(body))
                self.states.append(json.loads(body))
                next_state += state_every
            time.sleep(every)

    def growth(self, warm: float) -> float:
        """Median RSS of the last quarter of the run over the median just after warm-up:
        bodies in flight make RSS swing by tens of MiB, a leak moves the median."""
        end = self.rss[-1][0]
        early = [r for t, r in self.rss if warm <= t <= warm + end / 4] or [self.rss[0][1]]
        late = [r for t, r in self.rss if t >= end * 3 / 4]
        return statistics.median(late) - statistics.median(early)

    def p99(self) -> float:
        lat = sorted(self.latencies)
        return lat[int(len(lat) * 0.99) - 1]

    def report(self, what: str) -> str:
        lat = sorted(self.latencies)
        return (f"{what}: daemon RSS {self.rss[0][1]:.0f} -> peak {max(r for _, r in self.rss):.0f}"
                f" -> {self.rss[-1][1]:.0f} MiB (growth {self.growth(20):+.1f}), readers peak "
                f"{max(self.children_rss):.0f} MiB; /metrics p50 {lat[len(lat) // 2] * 1e3:.2f} "
                f"p99 {self.p99() * 1e3:.2f} max {lat[-1] * 1e3:.1f} ms over {len(lat)} requests")


def _walk_numbers(obj, path=""):
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk_numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk_numbers(v, f"{path}[{i}]")


def assert_sane(state: dict) -> None:
    for name, eng in state["signals"]["engines"].items():
        for path, v in _walk_numbers(eng, name):
            assert math.isfinite(v) and v >= 0, (path, v)
            assert v <= COUNTER_MAX, (path, v)
        for q, v in eng["queue_latency_seconds"].items():
            assert v <= MAX_QUEUE_SECONDS, (name, q, v)
        assert len(eng["reason"]) <= 600 and len(json.dumps(eng)) < 20_000, name
    for ev in state["recent_events"]:
        v = ev.get("value")
        assert v is None or math.isfinite(v), ev
        if ev.get("signal") == "queue_latency":
            assert v <= MAX_QUEUE_SECONDS, ev


def watch_with_baseline(abusive, daemon, paths, seconds: float, state_every: float):
    """Run a daemon scraping `paths` (and the healthy engine) next to one scraping only the
    healthy engine, both watched at the same time: what a shared or slow machine does to
    latency hits both, what the abusive endpoints do to the daemon shows in the first."""
    d = daemon(config_toml=config(abusive, paths))
    base = daemon(config_toml=config(abusive, ()))
    w, b = Watch(d), Watch(base)
    t = threading.Thread(target=b.run, args=(seconds,), kwargs={"state_every": 60})
    t.start()
    try:
        w.run(seconds, state_every=state_every)
    finally:
        t.join()
    print(b.report("baseline"))
    return w, b


def test_abusive_endpoints_leave_the_daemon_and_a_healthy_engine_alone(abusive, daemon):
    w, _ = watch_with_baseline(abusive, daemon, ABUSES, 90, state_every=2)
    print(w.report("campaign"))
    healthy = [s["signals"]["engines"].get("healthy") for s in w.states[5:]]
    assert healthy and all(h and h["up"] for h in healthy), "the healthy engine went down"
    final = w.states[-1]
    assert final["sources"]["engine:healthy"]["errors_total"] == 0
    assert not [e for e in final["recent_events"]
                if e.get("engine") == "healthy" and e.get("signal") == "engine_down"]
    for s in w.states:
        assert_sane(s)
    engines = final["signals"]["engines"]
    # unreadable, bombing, stalling endpoints: down with a short reason, no body kept
    for name, words in (("garbage", "binary"), ("prose", "starts with"),
                        ("bomb", "decompressed response is over"), ("slowloris", "within 2s")):
        assert not engines[name]["up"] and words in engines[name]["reason"], engines[name]
    # the huge valid one is read (its wanted series only)
    assert engines["huge"]["up"] and engines["huge"]["requests_running"] == 3, engines["huge"]
    # replicas are reported, not restarts; the churn is capped
    assert engines["replicas"]["replicas"] == 2 and engines["replicas"]["restarts_detected"] == 0
    # without a start time they are ambiguous: nothing derived, no restart storm
    blind = engines["blind_replicas"]
    assert blind["up"] and blind["ambiguous"] and blind["restarts_total"] <= 1, blind
    assert blind["preemption_rate_per_second"] is None and blind["preemptions_total"] is None
    assert engines["churn"]["series_groups"] <= 512 and engines["churn"]["limit"]
    assert w.state_bytes < 1_000_000
    growth = w.growth(warm=30)  # engine windows fill for their first minutes
    assert growth < 20, f"RSS grew {growth:.1f} MiB: {w.rss}"
    assert max(r for _, r in w.rss) < 400 and max(w.children_rss) < 600


@pytest.mark.timeout(600)
def test_label_churn_keeps_memory_bounded(abusive, daemon):
    """10k new label sets per scrape for three minutes."""
    w, _ = watch_with_baseline(abusive, daemon, ("churn",), 180, state_every=30)
    print(w.report("churn"))
    growth = w.growth(warm=20)
    churn = w.states[-1]["signals"]["engines"]["churn"]
    assert churn["up"] and churn["series_groups"] <= 512
    assert "max_series_groups" in churn["limit"]
    assert growth < 20, f"RSS grew {growth:.1f} MiB: {w.rss}"
