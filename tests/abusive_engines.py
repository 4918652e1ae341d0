"""Abusive engine endpoints on loopback, in a process of their own (so that generating their
bodies costs the test process nothing): `python -m tests.abusive_engines PORTFILE`.

Each path is one kind of abuse; /healthy is a well-behaved vLLM whose counters advance.
"""

from __future__ import annotations

import asyncio
import gzip
import math
import os
import random
import sys

from aiohttp import web

LAB = 'engine="0",model_name="m"'
CHURN_PER_SCRAPE = 10_000
HUGE_BYTES = 15 * 2**20


def vllm(q: float, h: float, *, preempt: float = 0, running: float = 3,
         start: float | None = 1e9,
         buckets: tuple[tuple[str, float], ...] = (("0.5", 0), ("+Inf", 0)),
         qsum: float = 0.0, lab: str = LAB) -> str:
    lines = [
        *([f"process_start_time_seconds {start}"] if start is not None else []),
        f"vllm:num_requests_running{{{lab}}} {running}",
        f"vllm:num_requests_waiting{{{lab}}} 1",
        f"vllm:kv_cache_usage_perc{{{lab}}} 0.25",
        f"vllm:prefix_cache_queries_total{{{lab}}} {q}",
        f"vllm:prefix_cache_hits_total{{{lab}}} {h}",
        f"vllm:num_preemptions_total{{{lab}}} {preempt}",
        *(f'vllm:request_queue_time_seconds_bucket{{{lab},le="{le}"}} {n}' for le, n in buckets),
        f"vllm:request_queue_time_seconds_count{{{lab}}} {buckets[-1][1]}",
        f"vllm:request_queue_time_seconds_sum{{{lab}}} {qsum}",
    ]
    return "\n".join(lines) + "\n"


class Engines:
    def __init__(self) -> None:
        self.n: dict[str, int] = {}
        self.rng = random.Random(5)
        self.garbage = os.urandom(2 * 2**20)
        self.prose = ("this is not a metrics page " * (HUGE_BYTES // 27)).encode()
        # 15 MB of valid exposition: a few wanted series among many the engine path skips
        line = 'vllm:unread_metric{{engine="0",id="{}"}} 1\n'
        filler = "".join(line.format(i) for i in range(HUGE_BYTES // len(line.format(10**6))))
        self.huge = (vllm(1, 1) + filler).encode()
        self.bomb = gzip.compress(b"\n" * (256 * 2**20), compresslevel=6)

    def count(self, path: str) -> int:
        self.n[path] = self.n.get(path, 0) + 1
        return self.n[path]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.strip("/")
        k = self.count(path)
        text = None
        if path == "healthy":
            n = 2 * k
            text = vllm(100 * k, 60 * k, preempt=k // 10, buckets=(("0.5", n), ("+Inf", n)),
                        qsum=0.2 * n)
        elif path == "churn":  # every scrape: 10k label sets never seen before
            text = vllm(100 * k, 60 * k) + "".join(
                f'vllm:prefix_cache_queries_total{{engine="c{k}-{i}",model_name="m"}} {i}\n'
                for i in range(CHURN_PER_SCRAPE))
        elif path == "garbage":
            return web.Response(body=self.garbage, content_type="application/octet-stream")
        elif path == "prose":
            return web.Response(body=self.prose, content_type="text/plain")
        elif path == "huge":
            return web.Response(body=self.huge, content_type="text/plain")
        elif path == "bomb":
            return web.Response(body=self.bomb, headers={"Content-Encoding": "gzip",
                                                         "Content-Type": "text/plain"})
        elif path == "slowloris":
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            try:
                for _ in range(120):
                    await resp.write(b"v")
                    await asyncio.sleep(0.5)
            except (ConnectionError, RuntimeError):
                pass
            return resp
        elif path == "insane":  # sane, then 1e308 / NaN / absurd buckets, then sane again
            bad = k % 4
            v = (100 * k, 60 * k) if bad in (0, 3) else ((1e308, 1e308) if bad == 1
                                                         else (math.nan, math.nan))
            le = (("-10", 4 * k), ("1e300", 8 * k), ("+Inf", 8 * k))
            text = vllm(*v, running=1e308 if bad else 2, preempt=v[0], buckets=le,
                        qsum=8 * k * 9.5e299)
        elif path == "backwards":  # counters wander up and down
            q = self.rng.randint(0, 10_000)
            text = vllm(q, q // 2, preempt=self.rng.randint(0, 100))
        elif path == "duplicate":  # each series twice, with different values
            text = vllm(100 * k, 60 * k) + vllm(5 * k, 1 * k)
        elif path == "replicas":  # two processes behind one URL, constant counters
            text = (vllm(5000, 2500, preempt=40, start=1.7e9) if k % 2 else
                    vllm(300, 150, preempt=2, start=1.7e9 + 3600))
        elif path == "blind_replicas":  # the same, with no start time to tell them apart
            text = (vllm(5000, 2500, preempt=40, start=None) if k % 2 else
                    vllm(300, 150, preempt=2, start=None))
        if text is None:
            raise web.HTTPNotFound()
        return web.Response(text=text, content_type="text/plain")


async def main(port_file: str) -> None:
    engines = Engines()
    app = web.Application()
    app.router.add_get("/{path}", engines.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, port_file)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
