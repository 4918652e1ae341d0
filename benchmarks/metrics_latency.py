"""/metrics latency with a simulated 8 GPUs x 64 processes host.

    python -m benchmarks.metrics_latency [--scrapes 2000]

Two figures: scrape latency at random moments while the daemon ticks (the daemon renders
each new state once, when it publishes it, so a scrape copies bytes unless it arrives while a
render holds the loop), and the render itself (paid once per tick, off the scrape path).
"""

from __future__ import annotations

import argparse
import http.client
import platform
import random
import statistics
import time

from benchmarks.report import emit
from tests.helpers import Daemon


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def render_cost(n: int) -> dict:
    from gpuwatch.exporter.render import Renderer
    from gpuwatch.exporter.snapshot import Snapshot
    from gpuwatch.model import Tick
    from gpuwatch.sources.simulate import SimulatedBackend

    backend = SimulatedBackend("large")
    tick = Tick(t=100.0, gpus=backend.sample(100.0))
    renderer = Renderer()
    times = []
    for v in range(n):
        snap = Snapshot(version=v + 1, tick=tick, ready=True)
        t0 = time.perf_counter()
        body = renderer.render(snap)
        times.append(time.perf_counter() - t0)
    return {"render_ms_p50": pct(times, 0.5) * 1e3, "render_ms_p99": pct(times, 0.99) * 1e3,
            "body_bytes": len(body), "series": body.count(b"\n") - body.count(b"\n#")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=2000)
    ap.add_argument("--max-gap", type=float, default=0.05,
                    help="seconds between scrapes, uniform in [0, max-gap]")
    args = ap.parse_args()
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(pathlib.Path(tmp), "--simulate", "large")
        try:
            time.sleep(3)
            conn = http.client.HTTPConnection("127.0.0.1", d.port)
            times = []
            rng = random.Random(0)
            for _ in range(args.scrapes):
                # Arrive at random moments relative to the 2 s tick, as Prometheus does.
                time.sleep(rng.uniform(0, args.max_gap))
                t0 = time.perf_counter()
                conn.request("GET", "/metrics")
                body = conn.getresponse().read()
                times.append(time.perf_counter() - t0)
            conn.close()
        finally:
            d.stop()
    res = {
        "machine": f"{platform.machine()} {platform.processor() or ''} python "
                   f"{platform.python_version()}".strip(),
        "scrapes": args.scrapes,
        "scrape_ms_p50": statistics.median(times) * 1e3,
        "scrape_ms_p99": pct(times, 0.99) * 1e3,
        "scrape_body_bytes": len(body),
        **render_cost(200),
    }
    emit(res)


if __name__ == "__main__":
    main()
