"""vLLM's `vllm.general_plugins` entry point (`gpuwatch_probe`).

vLLM calls register() in each of its processes (API server, engine core, workers) for every
installed plugin, so installing gpuwatch must not be enough to run a probe: it starts only
when the user opted in with GPUWATCH_PROBE_ENABLED=1. Processes that never initialise CUDA
(the API server) publish no allocator numbers.
"""

from __future__ import annotations

import os


def register() -> None:
    try:
        from gpuwatch.probe_agent import ENABLE_VAR, start
        from gpuwatch.probe_channel.config import is_true

        if is_true(os.environ.get(ENABLE_VAR, "")):
            start()
    except Exception:  # a plugin must never stop vLLM from starting
        pass
