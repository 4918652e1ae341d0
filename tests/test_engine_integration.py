"""A real engine endpoint on loopback plays a sequence while the daemon scrapes it and a
real Prometheus scrapes the daemon; what Prometheus stored is what gets checked.

Sequence: advancing counters -> engine restart (counter reset, new start time) -> a
response slower than the timeout -> a 50 MB body -> garbage -> healthy again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time

import pytest
from aiohttp import web

from tests.helpers import wait_until

pytestmark = pytest.mark.integration

LAB = 'engine="0",model_name="m"'
BOUNDS = ("0.3", "0.5", "1.0", "+Inf")


class FakeEngine:
    """A vLLM V1 /metrics endpoint whose counters advance on every request it serves."""

    def __init__(self) -> None:
        self.mode = "normal"
        self.q = self.h = 0
        self.requests = 0
        self.start = 1_700_000_000.0
        self.q_before_restart = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        self.mode = "normal"
        done = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        with contextlib.suppress(Exception):  # a failed test may leave a handler mid-way
            done.result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def restart(self) -> None:
        self.q_before_restart = self.q
        self.q = self.h = self.requests = 0
        self.start += 3600

    def text(self) -> str:
        # every request: 100 queried tokens, 60 hits, two requests queued 0.2 s
        self.q += 100
        self.h += 60
        self.requests += 2
        n = self.requests
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"process_start_time_seconds {self.start}",
            f"vllm:num_requests_running{{{LAB}}} 3",
            f"vllm:num_requests_waiting{{{LAB}}} 1",
            f"vllm:kv_cache_usage_perc{{{LAB}}} 0.25",
            f"vllm:prefix_cache_queries_total{{{LAB}}} {self.q}",
            f"vllm:prefix_cache_hits_total{{{LAB}}} {self.h}",
            f"vllm:num_preemptions_total{{{LAB}}} 0",
            *(f'vllm:request_queue_time_seconds_bucket{{{LAB},le="{b}"}} {n}' for b in BOUNDS),
            f"vllm:request_queue_time_seconds_count{{{LAB}}} {n}",
            f"vllm:request_queue_time_seconds_sum{{{LAB}}} {0.2 * n}",
        ]
        return "\n".join(lines) + "\n"

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        mode = self.mode
        if mode == "slow":
            await asyncio.sleep(4)
        if mode == "huge":  # 50 MB of valid-looking lines, no Content-Length
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            chunk = (f"vllm:num_requests_running{{{LAB}}} 3\n" * 20_000).encode()
            with contextlib.suppress(ConnectionError, RuntimeError):
                sent = 0
                while sent < 50 * 2**20:
                    await resp.write(chunk)
                    sent += len(chunk)
                await resp.write_eof()
            return resp
        if mode == "garbage":
            return web.Response(body=os.urandom(4096), content_type="application/octet-stream")
        return web.Response(body=self.text().encode(), content_type="application/octet-stream")


@pytest.fixture
def engine():
    fake = FakeEngine()
    yield fake
    fake.stop()


def test_engine_sequence_through_daemon_and_prometheus(engine, daemon, prometheus):
    d = daemon(config_toml=f"""
[nvml]
fast_interval_seconds = 0.5

[[engines]]
name = "fake"
url = "http://127.0.0.1:{engine.port}/metrics"
interval_seconds = 0.5
timeout_seconds = 1.0
down_after_failures = 2
""")
    prom = prometheus([d.address])
    sel = 'engine="fake"'

    def state():
        return d.state()["signals"]["engines"]["fake"]

    def wait_state(pred, what, timeout=20):
        return wait_until(lambda: pred(state()), timeout, what=what)

    def prom_up(value: int):
        prom.wait_for(f"gpuwatch_engine_up{{{sel}}} == {value}", timeout=20)

    # 1. advancing counters
    prom_up(1)
    prom.wait_for(f"gpuwatch_engine_prefix_cache_queries_total{{{sel}}} > 500")
    wait_state(lambda s: s["kv_cache_hit_ratio"] is not None, "a windowed hit ratio")

    # 2. the engine restarts: its counters start again from zero
    engine.restart()
    wait_state(lambda s: s["restarts_detected"] >= 1, "the restart seen")
    prom.wait_for(f"gpuwatch_engine_prefix_cache_queries_total{{{sel}}} > "
                  f"{engine.q_before_restart + 300}")

    # 3. slower than the timeout: down, and the daemon keeps answering quickly
    engine.mode = "slow"
    prom_up(0)
    wait_state(lambda s: s["consecutive_failures"] >= 2, "two failed scrapes")
    assert "within 1s" in state()["reason"]
    assert d.get("/metrics")[0] == 200
    engine.mode = "normal"
    prom_up(1)

    # 4. a 50 MB body: refused at the size cap, nothing parsed
    engine.mode = "huge"
    wait_state(lambda s: s["consecutive_failures"] >= 2 and "limit" in s["reason"],
               "the size cap")
    prom_up(0)
    engine.mode = "normal"
    prom_up(1)

    # 5. garbage
    engine.mode = "garbage"
    wait_state(lambda s: s["consecutive_failures"] >= 2, "garbage marks the engine down")
    assert state()["missing"]["requests_running"] == "engine down"
    prom_up(0)
    engine.mode = "normal"
    prom_up(1)
    time.sleep(2)

    # What Prometheus stored.
    def one(expr: str) -> float:
        result = prom.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    window = "[10m]"
    q = f"gpuwatch_engine_prefix_cache_queries_total{{{sel}}}"
    # the exported counter never went down: no reset across the engine restart
    assert one(f"resets({q}{window})") == 0
    assert one(q) > engine.q_before_restart
    # 60 of every 100 queried tokens hit, before and after the restart: the windowed ratio
    # never left 0.6 (no negative or absurd value at the reset)
    ratio = f"gpuwatch_engine_kv_cache_hit_ratio{{{sel}}}"
    assert one(f"min_over_time({ratio}{window})") == pytest.approx(0.6)
    assert one(f"max_over_time({ratio}{window})") == pytest.approx(0.6)
    # every queued request waited 0.2 s, in the engine's first bucket (0, 0.3]: the p50 is
    # only known to be at most 0.3 s (interpolation would say 0.15); the mean is exact
    p50 = f'gpuwatch_engine_queue_latency_window_seconds{{{sel},quantile="0.5"}}'
    assert one(f"max_over_time({p50}{window})") == pytest.approx(0.3)
    assert one(f"min_over_time({p50}{window})") == pytest.approx(0.3)
    mean = f"gpuwatch_engine_queue_latency_mean_seconds{{{sel}}}"
    assert one(f"max_over_time({mean}{window})") == pytest.approx(0.2)
    # the engine went down and came back; the daemon itself never did
    up = f"gpuwatch_engine_up{{{sel}}}"
    assert one(f"min_over_time({up}{window})") == 0
    assert one(up) == 1
    assert one('min_over_time(up{job="gpuwatch"}[10m])') == 1
    # values are absent while down, never 0: the gauge series has gaps, no zeros
    assert one(f"min_over_time(gpuwatch_engine_requests_running{{{sel}}}{window})") == 3
    assert prom.query(f"gpuwatch_engine_kv_cache_usage_ratio{{{sel}}}")[0]["value"][1] == "0.25"

    # engine_down fired (after two failed scrapes) and resolved, each time
    events = [e for e in d.state()["recent_events"] if e.get("signal") == "engine_down"]
    states = [e["state"] for e in events]
    assert states.count("firing") == 3 and states.count("resolved") == 3, events
