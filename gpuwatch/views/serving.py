"""The serving SLIs of an engine as people read them, from /api/state: per model, the TTFT,
inter-token and end-to-end p95 (or the mean where the engine has no histogram, or where the
quantile is below its first bucket: "≤ 300 ms"), tokens per second and the error ratio as
clients were answered and as the engine finished requests. The status page's script reads
the same fields alike."""

from __future__ import annotations

from gpuwatch.views import fmt

SLIS = (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E"))


def _d(v) -> dict:
    return v if isinstance(v, dict) else {}


def seconds(v) -> str:
    if not fmt._ok(v):
        return fmt.DASH
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2g} s" if v < 10 else f"{v:.0f} s"


def latency(s: dict, sli: str, q: str = "0.95") -> str:
    """'p95 120 ms', 'p95 ≤ 300 ms' (in the engine's first bucket), 'mean 8 ms', or a dash."""
    v = _d(_d(s.get("sli_quantiles_seconds")).get(sli)).get(q)
    if fmt._ok(v):
        below = q in (s.get("sli_below_resolution") or {}).get(sli, [])
        return f"p{float(q) * 100:g} {'≤ ' if below else ''}{seconds(v)}"
    mean = _d(s.get("sli_mean_seconds")).get(sli)
    return f"mean {seconds(mean)}" if fmt._ok(mean) else fmt.DASH


def rows(e: dict) -> list[tuple[str, dict]]:
    """(model, SLIs) of an engine: one per model where it serves several, else itself."""
    models = _d(e.get("models"))
    if models:
        return sorted((str(m), _d(s)) for m, s in models.items())
    return [(str(e.get("model") or ""), e)]


def line(model: str, s: dict) -> str:
    ratios = _d(s.get("request_error_ratios"))
    errors = " ".join(f"{seen} {fmt.percent(ratios[seen])}" for seen in ("client", "engine")
                      if seen in ratios) or fmt.DASH
    tps = s.get("generation_tokens_per_second")
    parts = [f"{name} {latency(s, sli)}" for sli, name in SLIS]
    parts.append(f"{tps:.0f} tok/s" if fmt._ok(tps) else f"{fmt.DASH} tok/s")
    parts.append(f"errors {errors}")
    return (f"{model or fmt.DASH}: " if model else "") + " · ".join(parts)


def lines(e: dict) -> list[str]:
    """One line per model of an up engine; none while it is down or ambiguous."""
    if e.get("up") is not True or e.get("ambiguous"):
        return []
    if e.get("models_loaded") == 0:
        return ["no model loaded"]
    return [line(m, s) for m, s in rows(e)]
