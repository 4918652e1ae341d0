"""`gpuwatch run` in a child process with faults a test chooses, for tests that need the real
daemon (HTTP, ticks, outputs) on a host without a GPU.

    python -m tests.fault_daemon [--xid N ...] [--lost] [--ecc-uncorrected N] [--clock X] -- ARGS

--xid queues XID events on GPU 0 of a fake driver (tests/fake_nvml.py behind the real pynvml
and NvmlBackend); --clock runs the wall clock X times faster (a `--simulate leak` reaches
its critical time to OOM in seconds); without --xid/--lost/--ecc-uncorrected the fake
driver is not installed (use --simulate).
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser()
    p.add_argument("--xid", type=int, action="append", default=[])
    p.add_argument("--lost", action="store_true")
    p.add_argument("--ecc-uncorrected", type=int, default=0)
    p.add_argument("--clock", type=float, default=1.0)
    opts = p.parse_args(argv[:split])
    if opts.clock != 1.0:
        real, t0 = time.time, time.time()
        time.time = lambda: t0 + (real() - t0) * opts.clock
    if opts.xid or opts.lost or opts.ecc_uncorrected:
        import pynvml
        import pytest

        from tests.fake_nvml import FakeGpu, FakeNvml, err

        gpus = [FakeGpu(0), FakeGpu(1)]
        fake = FakeNvml(gpus)
        fake.install(pytest.MonkeyPatch())
        fake.events = [SimpleNamespace(device=gpus[0], eventData=x, eventType=0)
                       for x in opts.xid]
        if opts.lost:
            gpus[1].fail["utilization"] = err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if opts.ecc_uncorrected:
            n = opts.ecc_uncorrected
            gpus[1].fail.pop("ecc", None)
            pynvml.nvmlDeviceGetTotalEccErrors = (
                lambda h, e, c: n if e == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0)
    from gpuwatch import serve
    from gpuwatch.cli import main as cli

    serve.IN_PROCESS = True  # the faults are patched into this process
    return cli.main(["run", *argv[split + 1:]], standalone_mode=False) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
