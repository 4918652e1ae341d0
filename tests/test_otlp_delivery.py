"""OTLP delivery: retryable failures back off, refusals drop the request, partial success is
counted (a real HTTP server, a clock the test moves); a receiver that is down or slow costs a
bounded queue and one log line per interval, never the tick (a real daemon)."""

from __future__ import annotations

import asyncio
import math
import socket
import time

import pytest

from tests.helpers import http_get
from tests.test_series_budget import parse

pb = pytest.importorskip("opentelemetry.proto.metrics.v1.metrics_pb2",
                         reason="the [otlp] extra (opentelemetry-proto) is not installed")
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
)

from tests.test_otlp import _snap  # noqa: E402

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


def test_a_redirect_is_not_followed_the_credentials_stay_with_the_endpoint():
    _recv, pusher, seen = _deliver([(308, {"Location": "http://127.0.0.1:9/elsewhere"}, b"")],
                                  rounds=2)
    assert seen == [0.0, 10.0] and pusher.counters["rejected"] == 1
    assert pusher.counters["pushed"] == 1


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
