"""Recognize which engine wrote an exposition from the metric names it contains."""

from __future__ import annotations

# Sample-line prefixes that only the given engine writes.
SIGNATURES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm:",),
    "sglang": ("sglang:",),
    "tgi": ("tgi_",),
    "llamacpp": ("llamacpp:",),
    "triton": ("nv_inference_", "nv_trt_llm_"),
}
# Families only Triton's server writes, models or not: an exposition with nothing else is
# a Triton serving no model.
TRITON_SERVER = ("nv_pinned_memory_pool_", "nv_cpu_utilization", "nv_gpu_utilization")


def _count(text: str, prefix: str) -> int:
    return text.count("\n" + prefix) + (1 if text.startswith(prefix) else 0)


def detect_kind(text: str) -> str | None:
    """The engine kind with the most sample lines under its prefixes, or None."""
    best, best_n = None, 0
    for kind, prefixes in SIGNATURES.items():
        n = sum(_count(text, p) for p in prefixes)
        if n > best_n:
            best, best_n = kind, n
    if best is None and any(_count(text, p) for p in TRITON_SERVER):
        return "triton"
    return best


def describe_unrecognized(text: str) -> str:
    """Why an exposition was not recognized, for /api/state."""
    head = text.lstrip()[:64]
    if not head:
        return "empty response"
    if "\x00" in text[:4096]:
        return "binary response, not a Prometheus text exposition"
    if head.startswith("<"):
        return "HTML/XML response, not a Prometheus text exposition"
    if head.startswith(("{", "[")):
        return "JSON response, not a Prometheus text exposition"
    return "no vllm:, sglang:, tgi_, llamacpp: or nv_inference_ metrics in the response"
