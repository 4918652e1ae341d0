"""On a real GPU: an engine found by its metrics port is linked to the GPU its process uses,
through NVML's process list (needs an NVIDIA driver and torch with CUDA)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.engines.config import DiscoveryConfig, EngineConfig
from gpuwatch.model import GpuSample, ProcessSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from gpuwatch.signals.engine import EngineAnalyzer
from gpuwatch.sources.engines import EngineSource

pytestmark = pytest.mark.gpu

FIXTURE = Path(__file__).parent / "fixtures" / "engines" / "vllm-0.33.0-statlogger.prom"

# A stand-in engine: holds 256 MiB on cuda:0 from a child process (as vLLM's engine core
# does) and serves a vLLM exposition from the parent.
ENGINE = """
import multiprocessing as mp, sys, time
from aiohttp import web

def hold(ready):
    import torch
    x = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")
    x.fill_(1)
    torch.cuda.synchronize()
    ready.set()
    time.sleep(600)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    ctx.Process(target=hold, args=(ready,), daemon=True).start()
    if not ready.wait(120):
        sys.exit("no CUDA allocation")
    body = open(sys.argv[1], "rb").read()
    async def h(request):
        return web.Response(body=body, content_type="text/plain")
    app = web.Application()
    app.router.add_get("/metrics", h)
    print("ready", flush=True)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None, access_log=None)
"""


def _cuda_torch() -> bool:
    try:
        out = subprocess.run([sys.executable, "-c",
                              "import torch; print(torch.cuda.is_available())"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "True"


def _nvml_gpus() -> list[GpuSample]:
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            out.append(GpuSample(index=i, uuid=uuid,
                                 processes=[ProcessSample(pid=p.pid) for p in procs]))
        return out
    finally:
        pynvml.nvmlShutdown()


def test_engine_is_linked_to_its_gpu_through_nvml_pids(tmp_path):
    if not _cuda_torch():
        pytest.skip("torch with CUDA is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    proc = subprocess.Popen([sys.executable, str(script), str(FIXTURE), str(port)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"

        async def scrape_for_a_while():
            samples = []
            src = EngineSource([EngineConfig(name="gpu-engine",
                                             url=f"http://127.0.0.1:{port}/metrics",
                                             interval_seconds=0.5)], DiscoveryConfig())
            task = asyncio.create_task(src.run(samples.append))
            for _ in range(40):
                await asyncio.sleep(0.25)
                if samples and samples[-1].pids and samples[-1].error is None:
                    break
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return samples

        samples = asyncio.run(scrape_for_a_while())
        sample = samples[-1]
        assert sample.error is None and proc.pid in sample.pids
        gpus = _nvml_gpus()
        analyzer, derived = EngineAnalyzer(), Derived()
        analyzer.update(Tick(t=1.0, gpus=gpus, engines=[sample]), derived, Conditions())
        state = derived.engines["gpu-engine"]
        assert state.up and state.kind == "vllm"
        assert gpus[0].uuid in state.gpus and state.gpus[gpus[0].uuid] == 0, (
            f"engine pids {sample.pids}, NVML pids "
            f"{[(g.index, [p.pid for p in g.processes]) for g in gpus]}")
    finally:
        import psutil

        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()  # the allocation holder, so its GPU memory is freed now
        proc.kill()
        proc.wait()
