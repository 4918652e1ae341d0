"""What the in-process probe costs a PyTorch process (needs torch with CUDA).

Two step loops, each timed with the probe off and on, in ABBA-ordered blocks so drift in
clocks or thermals favours neither, next to an off-against-off run (the method's noise
floor):
  train  an MLP forward + backward + optimizer step on a batch whose size changes each step
         (the allocator keeps splitting and reusing blocks);
  serve  a decode-like step: a few small matmuls plus KV-like tensors of 1-8 MiB allocated
         and freed each step, so steps are short (the worst case for a fixed cost).
The probe runs at its default interval and at an aggressive one (0.1 s, overhead budget off)
to show the worst case. Also reported: the CPU time of one publish (memory_stats + snapshot
summary + atomic write) with the workload's allocator state.

    python -m benchmarks.probe_overhead [--seconds 3] [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time

from benchmarks.report import emit
from gpuwatch.probe_channel.config import ProbeConfig


def _torch():
    try:
        import torch
    except ImportError:
        sys.exit("probe_overhead: needs torch (with CUDA)")
    if not torch.cuda.is_available():
        sys.exit("probe_overhead: needs a CUDA GPU")
    return torch


def make_train(torch):
    dev = "cuda"
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
        torch.nn.GELU(), torch.nn.Linear(4096, 2048)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sizes = [64, 96, 128, 160, 192, 256]
    state = {"i": 0}

    def step():
        n = sizes[state["i"] % len(sizes)]
        state["i"] += 1
        x = torch.randn(n, 2048, device=dev)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def make_serve(torch):
    dev = "cuda"
    w = [torch.randn(4096, 4096, device=dev, dtype=torch.float16) for _ in range(4)]
    state = {"i": 0, "kv": []}

    def step():
        i = state["i"] = state["i"] + 1
        x = torch.randn(8 + i % 24, 4096, device=dev, dtype=torch.float16)
        for m in w:
            x = torch.nn.functional.silu(x @ m)
        # KV-like churn: allocate 1-8 MiB blocks, keep a window of them
        state["kv"].append(torch.empty((1 + i % 8) * 2**20, dtype=torch.uint8, device=dev))
        if len(state["kv"]) > 32:
            del state["kv"][::3]
    return step


def timed_block(torch, step, seconds: float) -> list[float]:
    out = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def compare(torch, step, config: ProbeConfig | None, seconds: float, rounds: int) -> dict:
    """Blocks with the probe off and on, in ABBA order (drift in clocks or thermals then
    favours neither). config None: off against off, the noise floor of the method."""
    import gpuwatch.probe_agent as probe  # not gpuwatch.probe: that would start one now

    off: list[float] = []
    on: list[float] = []
    paired: list[float] = []
    publishes = 0
    for r in range(rounds):
        means = {}
        for probe_on in ((False, True) if r % 2 == 0 else (True, False)):
            agent = probe.start(config) if probe_on and config is not None else None
            if probe_on and config is not None:
                assert agent is not None, "the probe did not start"
            block = timed_block(torch, step, seconds)
            if agent is not None:
                publishes += agent.publishes
                probe.stop()
            (on if probe_on else off).extend(block)
            means[probe_on] = statistics.fmean(block)
        paired.append(100 * (means[True] - means[False]) / means[False])
    m_off, m_on = statistics.median(off), statistics.median(on)
    mean_off, mean_on = statistics.fmean(off), statistics.fmean(on)
    return {
        "interval_seconds": config.interval_seconds if config else None,
        "steps_off": len(off), "steps_on": len(on), "publishes": publishes,
        "step_ms_median_off": m_off * 1e3, "step_ms_median_on": m_on * 1e3,
        "step_ms_mean_off": mean_off * 1e3, "step_ms_mean_on": mean_on * 1e3,
        "overhead_pct_mean": 100 * (mean_on - mean_off) / mean_off,
        "overhead_pct_paired_median": statistics.median(paired),
        "overhead_pct_paired": [round(x, 2) for x in paired],
    }


def publish_cost(torch, directory: str, n: int = 200) -> dict:
    from gpuwatch.probe_agent.agent import Agent

    agent = Agent(ProbeConfig(dir=directory))
    cpu, wall = [], []
    for _ in range(n):
        c0, w0 = time.thread_time(), time.perf_counter()
        agent.publish()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    rec = agent.collect()
    agent.stop()
    segments = sum(s.get("segments", 0) if isinstance(s, dict) else (s.segments or 0)
                   for s in rec.samples)
    cpu.sort()
    return {"publish_cpu_us_median": statistics.median(cpu) * 1e6,
            "publish_cpu_us_p99": cpu[int(0.99 * len(cpu))] * 1e6,
            "publish_wall_us_median": statistics.median(wall) * 1e6,
            "segments": segments}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0, help="per timed block")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch = _torch()
    res: dict = {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
        "seconds_per_block": args.seconds, "rounds": args.rounds,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("train", make_train), ("serve", make_serve)):
            step = make(torch)
            timed_block(torch, step, 2.0)  # warm up: kernels, allocator pool
            res[name] = {
                "noise_floor": compare(torch, step, None, args.seconds, args.rounds),
                "default": compare(torch, step, ProbeConfig(dir=tmp), args.seconds, args.rounds),
                "aggressive": compare(torch, step, ProbeConfig(
                    dir=tmp, interval_seconds=0.1, max_overhead_ratio=1.0),
                    args.seconds, args.rounds),
                **publish_cost(torch, tmp),
            }
            # What the probe's own work costs the host: its publishes' wall time over the run.
            d = res[name]["default"]
            run_s = d["steps_on"] * d["step_ms_mean_on"] / 1e3
            res[name]["default"]["publish_duty_pct"] = (
                100 * d["publishes"] * res[name]["publish_wall_us_median"] / 1e6 / run_s)
    emit(res, args.json)


if __name__ == "__main__":
    main()
