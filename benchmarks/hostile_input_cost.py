"""What hostile input costs: the figures the tests used to assert as latencies.

    python -m benchmarks.hostile_input_cost [--fault-seconds 60] [-o FILE]

- `aliases.canonical` renaming a 200 000-line NIM exposition;
- `redact.scrub_text` over a megabyte of hostile text (three shapes);
- an engine source scraping a healthy endpoint alone, then next to two 15 MB bodies, 2 MiB
  of binary garbage and a slowloris: healthy samples per second in each phase;
- the fault campaign's daemons (tests/test_fault_engines.py): /metrics p50/p99 of a daemon
  scraping the abusive endpoints (all of them, then the label churn alone) beside a daemon
  scraping only the healthy one, watched at the same time.

The tests keep what these inputs must not break (bounded memory, no error on the healthy
engine, the right values); the times are here, quoted with the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import time

from benchmarks.report import emit


def timed(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def text_costs() -> dict:
    from gpuwatch import redact
    from gpuwatch.exposition import aliases

    rows = "".join(f'num_requests_running{{model_name="m{i}"}} 1\n' for i in range(200_000))
    out = {"aliases_canonical_200k_lines_s": round(timed(lambda: aliases.canonical(rows)), 4)}
    for name, text in (("colons", "://" * 400_000), ("long_host", "://" + "a" * 1_200_000),
                       ("credentials", ("http://" + "b" * 1000 + "@") * 1000)):
        out[f"scrub_text_{name}_s"] = round(
            timed(lambda t=text: redact.scrub_text(t, ["never-there"])), 4)
    return out


def healthy_beside_abusive(seconds: float = 12.0) -> dict:
    from aiohttp import web

    from tests.test_engine_source import VLLM, cfg, run_source, slowloris

    huge = ("".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n'
                    for i in range(250_000))).encode()
    junk = os.urandom(2 * 2**20)

    async def body(data):
        return web.Response(body=data)

    async def fast(request):
        return web.Response(text=VLLM)

    async def big(request):
        return await body(huge)

    async def garbage(request):
        return await body(junk)

    out = {}
    for phase, handlers in (("alone", {"/fast": fast}),
                            ("beside_abusive", {"/big1": big, "/big2": big,
                                                "/garbage": garbage, "/slowloris": slowloris,
                                                "/fast": fast})):
        samples = asyncio.run(run_source(handlers, lambda port, h=handlers: [
            cfg(port, p, interval_seconds=0.3, timeout_seconds=1.0) for p in h], seconds))
        ok = [s for s in samples if s.name == "e-fast" and s.error is None]
        # from the first sample on: starting the body readers is not the steady rate
        span = ok[-1].t - ok[0].t if len(ok) > 1 else 0.0
        out[f"healthy_samples_per_s_{phase}"] = round((len(ok) - 1) / span, 2) if span else None
        out[f"healthy_samples_{phase}"] = len(ok)
        if ok:
            out[f"healthy_scrape_p50_s_{phase}"] = round(
                statistics.median(s.duration_seconds for s in ok), 4)
    return out


def fault_campaign(seconds: float) -> dict:
    import tempfile
    from pathlib import Path

    from tests.helpers import Daemon
    from tests.test_fault_engines import ABUSES, abusive_endpoints, watch_with_baseline

    out = {}
    for name, paths in (("campaign", ABUSES), ("churn", ("churn",))):
        with tempfile.TemporaryDirectory() as tmp:
            started: list[Daemon] = []

            def start(*args, _tmp=tmp, _started=started, **kw):
                d = Daemon(Path(_tmp), *args, **kw)
                _started.append(d)
                return d

            with abusive_endpoints(Path(tmp)) as port:
                try:
                    w, base = watch_with_baseline(port, start, paths, seconds, state_every=10)
                finally:
                    for d in started:
                        d.stop()
            for who, watch in (("abused", w), ("baseline", base)):
                lat = sorted(watch.latencies)
                out[f"{name}_{who}_metrics_p50_ms"] = round(lat[len(lat) // 2] * 1e3, 2)
                out[f"{name}_{who}_metrics_p99_ms"] = round(watch.p99() * 1e3, 2)
            out[f"{name}_rss_growth_mib"] = round(w.growth(warm=min(20, seconds / 4)), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fault-seconds", type=float, default=60.0,
                    help="how long each fault phase is watched (0: skip them)")
    ap.add_argument("-o", "--output")
    args = ap.parse_args()
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} vCPU",
              "python": platform.python_version(), **text_costs(), **healthy_beside_abusive()}
    if args.fault_seconds > 0:
        result.update(fault_campaign(args.fault_seconds))
    emit(result, args.output)


if __name__ == "__main__":
    main()
