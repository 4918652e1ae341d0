"""Serving-SLI families of the simulated vLLM server (engine_text.py): TTFT, inter-token and
end-to-end latency histograms, token counters, finished requests by reason, waiting by reason.

Pure functions of the elapsed time like the rest of the simulated exposition, with the same
guarantees (counters and buckets only grow, +Inf equals _count). For elapsed time e:
- TTFT is the queue time's lognormal shifted by TTFT_EXTRA seconds of prefill, E2E by
  E2E_EXTRA of prefill and decode; both counted for every request that left the queue;
- ITL is lognormal around ITL_MEDIAN, one observation per generated token after the first;
- prompt tokens are the prefix-cache queries; generated tokens GEN_TOKENS_PER_REQUEST per
  request; finished requests floor(rate * e) per reason, errors one every ERROR_EVERY s;
- the HTTP layer answered every finished request with a 2xx, and refused one bad request
  every REFUSED_EVERY s with a 4xx.
"""

from __future__ import annotations

import math

import gpuwatch.sources.simulate.workload as base

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TTFT_EXTRA, E2E_EXTRA, ITL_MEDIAN, SIGMA = 0.12, 3.0, 0.025, 0.5
GEN_TOKENS_PER_REQUEST = 120.0
REASON_RATES = {"stop": 3.5, "length": 0.45}  # requests per second
ERROR_EVERY, ABORT_EVERY = 120.0, 45.0
REFUSED_EVERY = 20.0  # a bad request the HTTP layer refuses (400) before the engine sees it


def _shifted(e: float, le: float, extra: float, traffic: base.Traffic) -> float:
    rate = base.REQUESTS_PER_SECOND
    return float(math.floor(rate * base.segments_integral(
        e, lambda m: base.lognormal_cdf(le, m + extra, base.QUEUE_SIGMA), traffic)))


def generation_total(e: float) -> float:
    return float(math.floor(base.REQUESTS_PER_SECOND * GEN_TOKENS_PER_REQUEST * max(e, 0.0)))


def finished_by_reason(e: float) -> dict[str, float]:
    e = max(e, 0.0)
    out = {r: float(math.floor(rate * e)) for r, rate in REASON_RATES.items()}
    out["abort"] = float(math.floor(e / ABORT_EVERY))
    out["error"] = float(math.floor(e / ERROR_EVERY))
    return out


def _histogram(name: str, labels: str, bounds, counts: list[float], total: float,
               seconds: float, engine: str, model: str) -> list[str]:
    rows = [f"# TYPE {name} histogram"]
    for le, v in zip(bounds, counts, strict=True):
        rows.append(f'{name}_bucket{{engine="{engine}",le="{float(le)}",'
                    f'model_name="{model}"}} {min(v, total)!r}')
    rows.append(f'{name}_bucket{{engine="{engine}",le="+Inf",model_name="{model}"}} '
                f"{total!r}")
    rows += [f"{name}_count{{{labels}}} {total!r}", f"{name}_sum{{{labels}}} {seconds!r}"]
    return rows


def serving_lines(elapsed: float, model: str, engine: str, waiting: int,
                  traffic: base.Traffic = base.CYCLING) -> list[str]:
    e = max(elapsed, 0.0)
    labels = f'engine="{engine}",model_name="{model}"'
    done = base.finished_total(e)
    queue_s = base.queue_seconds_total(e, traffic)
    lines: list[str] = []
    for name, bounds, extra in (("vllm:time_to_first_token_seconds", TTFT_BUCKETS, TTFT_EXTRA),
                                ("vllm:e2e_request_latency_seconds", base.QUEUE_BUCKETS,
                                 E2E_EXTRA)):
        counts = [_shifted(e, le, extra, traffic) for le in bounds]
        lines += _histogram(name, labels, bounds, counts, done, round(queue_s + extra * done, 3),
                            engine, model)
    tokens = generation_total(e)
    itl_n = max(tokens - done, 0.0)
    itl = [float(math.floor(itl_n * base.lognormal_cdf(le, ITL_MEDIAN, SIGMA)))
           for le in ITL_BUCKETS]
    mean = ITL_MEDIAN * math.exp(SIGMA**2 / 2)
    lines += _histogram("vllm:inter_token_latency_seconds", labels, ITL_BUCKETS, itl, itl_n,
                        round(itl_n * mean, 3), engine, model)
    lines += [
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {base.queries_total(e)!r}",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {tokens!r}",
        "# TYPE vllm:request_success_total counter",
        *(f'vllm:request_success_total{{engine="{engine}",finished_reason="{r}",'
          f'model_name="{model}"}} {v!r}' for r, v in finished_by_reason(e).items()),
        # its API server's HTTP layer: the refused requests, and everything the engine
        # finished (an abandoned stream is still a 200 there)
        "# TYPE http_requests_total counter",
        f'http_requests_total{{handler="/v1/completions",method="POST",status="2xx"}} '
        f"{sum(finished_by_reason(e).values())!r}",
        f'http_requests_total{{handler="/v1/completions",method="POST",status="4xx"}} '
        f"{float(math.floor(e / REFUSED_EVERY))!r}",
        "# TYPE vllm:num_requests_waiting_by_reason gauge",
        f'vllm:num_requests_waiting_by_reason{{{labels},reason="capacity"}} {float(waiting)!r}',
        f'vllm:num_requests_waiting_by_reason{{{labels},reason="deferred"}} 0.0',
    ]
    return lines
