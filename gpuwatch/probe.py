"""gpuwatch's in-process probe: a background thread in a PyTorch process that publishes the
caching allocator's state for the gpuwatch daemon and carries out its flush / snapshot
requests. See docs/probe.md.

Turning it on, any one of:
  * `import gpuwatch.probe` in the program (before or after torch: the probe waits for the
    program to initialise CUDA itself);
  * `gpuwatch.probe.start()`, with a ProbeConfig if wanted;
  * in vLLM: export GPUWATCH_PROBE_ENABLED=1; vLLM loads the `vllm.general_plugins` entry
    point `gpuwatch_probe` in each of its processes, which starts the probe only then.

Until the program has imported torch the probe writes nothing. GPUWATCH_PROBE_ENABLED=0
keeps the probe off in every case. `gpuwatch.probe.stop()` ends it (it also stops at exit);
`gpuwatch.probe.current()` returns the running agent. Nothing here raises into the host
program.
"""

from __future__ import annotations

from gpuwatch.probe_agent import ProbeConfig, current, start, stop

__all__ = ["ProbeConfig", "current", "start", "stop"]

start()
