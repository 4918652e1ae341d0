"""Engine collection cost: parse + normalize of a vLLM exposition, and 16 endpoints.

    python -m benchmarks.engine_parse [--seconds 10] [--json FILE]

1. read() (select lines, prometheus_client parse, normalize) of vLLM 0.33.0's own 57 KB
   exposition, of a 4-engine data-parallel one, and one analyzer update (read + counters +
   windows + quantiles + judgement), as the daemon does per scrape, live and in replay.
2. 16 endpoints on loopback (a separate server process) scraped every second by one
   EngineSource, plus the same with 2 of them answering slower than their timeout: scrape
   durations, samples per endpoint, and the analyzer time of a tick carrying 16 samples.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import emit

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "engines"
VLLM = (FIXTURES / "vllm-0.33.0-statlogger.prom").read_text()
VLLM_LATER = (FIXTURES / "vllm-0.33.0-statlogger-later.prom").read_text()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def stats_ms(xs: list[float]) -> dict:
    return {"median_ms": round(statistics.median(xs) * 1e3, 3),
            "p99_ms": round(pct(xs, 0.99) * 1e3, 3), "max_ms": round(max(xs) * 1e3, 3),
            "n": len(xs)}


def data_parallel(text: str, engines: int) -> str:
    """The exposition with every vllm: series repeated for engine="0".."N-1"."""
    out = []
    for line in text.splitlines():
        if line.startswith("vllm:") and 'engine="0"' in line:
            out += [line.replace('engine="0"', f'engine="{i}"') for i in range(engines)]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def time_calls(fn, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def parse_costs(n: int) -> dict:
    from gpuwatch.exposition import read
    from gpuwatch.model import EngineSample, Tick
    from gpuwatch.signals.conditions import Conditions
    from gpuwatch.signals.derived import Derived
    from gpuwatch.signals.engine import EngineAnalyzer

    dp4 = data_parallel(VLLM, 4)
    out = {
        "vllm_bytes": len(VLLM.encode()), "vllm_lines": VLLM.count("\n"),
        "read_vllm": stats_ms(time_calls(lambda: read(VLLM), n)),
        "dp4_bytes": len(dp4.encode()),
        "read_vllm_dp4": stats_ms(time_calls(lambda: read(dp4), n)),
    }
    analyzer, derived, conditions = EngineAnalyzer(), Derived(), Conditions()
    texts = [VLLM, VLLM_LATER]
    i = [0]

    def update():
        i[0] += 1
        t = float(i[0])
        sample = EngineSample(name="e", url="u", exposition=texts[i[0] % 2], t=t)
        analyzer.update(Tick(t=t, engines=[sample]), derived, conditions)

    out["analyzer_update_vllm"] = stats_ms(time_calls(update, n))
    return out


SERVER = """
import asyncio, sys
from aiohttp import web
body = open(sys.argv[1], 'rb').read()
slow = set(sys.argv[3].split(',')) if len(sys.argv) > 3 and sys.argv[3] else set()
async def h(request):
    if request.match_info['n'] in slow:
        await asyncio.sleep(5)
    return web.Response(body=body, content_type='text/plain')
app = web.Application()
app.router.add_get('/{n}/metrics', h)
web.run_app(app, host='127.0.0.1', port=int(sys.argv[2]), print=None, access_log=None)
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run_source(port: int, endpoints: int, seconds: float, timeout: float) -> list:
    from gpuwatch.engines.config import DiscoveryConfig, EngineConfig
    from gpuwatch.sources.engines import EngineSource

    cfgs = [EngineConfig(name=f"e{i}", url=f"http://127.0.0.1:{port}/{i}/metrics",
                         interval_seconds=1.0, timeout_seconds=timeout) for i in range(endpoints)]
    samples: list = []
    task = asyncio.create_task(EngineSource(cfgs, DiscoveryConfig()).run(samples.append))
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return samples


def endpoints_cost(seconds: float, slow: str) -> dict:
    from gpuwatch.model import Tick
    from gpuwatch.signals.conditions import Conditions
    from gpuwatch.signals.derived import Derived
    from gpuwatch.signals.engine import EngineAnalyzer

    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER,
                               str(FIXTURES / "vllm-0.33.0-statlogger.prom"), str(port), slow])
    try:
        import urllib.request

        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/0/metrics", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        samples = asyncio.run(run_source(port, 16, seconds, timeout=2.0))
    finally:
        server.terminate()
        server.wait()
    slow_names = {f"e{n}" for n in slow.split(",") if n}
    ok = [s for s in samples if s.error is None]
    per = {f"e{i}": sum(1 for s in samples if s.name == f"e{i}") for i in range(16)}
    # the daemon's tick: the last full round of 16 samples through the analyzer
    analyzer, derived, conditions = EngineAnalyzer(), Derived(), Conditions()
    rounds = [samples[i:i + 16] for i in range(0, len(samples) - 15, 16)]
    tick_times = []
    for k, batch in enumerate(rounds):
        t0 = time.perf_counter()
        analyzer.update(Tick(t=float(k), engines=batch), derived, conditions)
        tick_times.append(time.perf_counter() - t0)
    return {
        "seconds": seconds, "slow_endpoints": sorted(slow_names),
        "samples_per_endpoint": per,
        "fast_scrape_duration": stats_ms(
            [s.duration_seconds for s in ok if s.name not in slow_names]),
        "slow_errors": sorted({s.error for s in samples if s.name in slow_names}),
        "errors_on_fast_endpoints": sum(1 for s in samples
                                        if s.error and s.name not in slow_names),
        "analyzer_tick_16_samples": stats_ms(tick_times) if tick_times else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json")
    args = ap.parse_args()
    result = {
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or
                    platform.machine(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "parse": parse_costs(args.calls),
        "16_endpoints": endpoints_cost(args.seconds, ""),
        "16_endpoints_2_slow": endpoints_cost(args.seconds, "3,11"),
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
