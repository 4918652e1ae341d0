"""gpuwatch's in-process probe: a background thread in a PyTorch process that publishes the
caching allocator's state for the gpuwatch daemon and carries out its flush / snapshot
requests. See docs/probe.md.

Turning it on, any one of:
  * `import gpuwatch.probe` in the program (before or after torch: the probe waits for the
    program to initialise CUDA itself);
  * `gpuwatch.probe.start()`, with a ProbeConfig if wanted;
  * in vLLM: export GPUWATCH_PROBE_ENABLED=1; vLLM loads the `vllm.general_plugins` entry
    point `gpuwatch_probe` in each of its processes, which starts the probe only then.

Importing one of this package's modules (`import gpuwatch.probe.requests`, `.config`,
`.vllm_plugin` …), or gpuwatch's own modules importing it, does not start it: the daemon
imports those and must never run a probe (nor import torch). (`from gpuwatch.probe import
requests` cannot be told from `import gpuwatch.probe`: use the dotted form.) Until the
program has imported torch the probe writes nothing. GPUWATCH_PROBE_ENABLED=0 keeps the
probe off in every case.

Nothing here raises into the host program.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

from gpuwatch.probe.config import ProbeConfig

if TYPE_CHECKING:
    from gpuwatch.probe.agent import Agent

__all__ = ["ProbeConfig", "current", "start", "stop"]

log = logging.getLogger(__name__)

ENABLE_VAR = "GPUWATCH_PROBE_ENABLED"

_lock = threading.Lock()
_agent: Agent | None = None
_atexit_registered = False


def start(config: ProbeConfig | None = None) -> Agent | None:
    """Start the probe in this process, once (later calls return the running agent).

    config: defaults to the GPUWATCH_PROBE_* environment; a probe already running with
    other settings (`import gpuwatch.probe` started it) is restarted with these. Returns None
    when the probe is disabled or could not start (the reason is logged); never raises.
    """
    global _agent, _atexit_registered
    try:
        from gpuwatch.probe.config import from_environ, is_false

        if is_false(os.environ.get(ENABLE_VAR, "")):
            return None
        with _lock:
            running = _agent is not None and _agent.pid == os.getpid() and _agent.running
            if running and (config is None or config == _agent.config):
                return _agent
            if running:
                _agent.stop()
            from gpuwatch.probe.agent import Agent

            agent = Agent(config if config is not None else from_environ())
            agent.start()
            _agent = agent
            if not _atexit_registered:
                atexit.register(stop)
                _atexit_registered = True
            return agent
    except Exception as exc:
        log.warning("gpuwatch probe not started: %s: %s", type(exc).__name__, exc)
        return None


def stop(timeout: float = 5.0) -> None:
    """Stop the probe and remove its record; never raises."""
    global _agent
    try:
        with _lock:
            agent, _agent = _agent, None
        if agent is not None and agent.pid == os.getpid():
            agent.stop(timeout)
    except Exception as exc:
        log.warning("gpuwatch probe: stop: %s: %s", type(exc).__name__, exc)


def current() -> Agent | None:
    """The probe running in this process, if any."""
    agent = _agent
    return agent if agent is not None and agent.pid == os.getpid() else None


def _forget_after_fork() -> None:
    # The child has no probe thread; a start() there (vLLM loads its plugins again in each
    # worker) makes a new one for the child's own pid.
    global _agent, _lock
    _agent = None
    _lock = threading.Lock()


def _imported_by_gpuwatch() -> bool:
    """True when the import under way is of one of this package's modules (the daemon's
    `gpuwatch.probe.config`, vLLM's `gpuwatch.probe.vllm_plugin`) or of another gpuwatch
    module that needs this package, rather than of the package itself by a program.

    Python runs a package's __init__ before any of its modules; the name being imported is
    only visible in the import machinery's frames, so look there.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_find_and_load" and "importlib" in frame.f_code.co_filename:
            name = frame.f_locals.get("name")
            if isinstance(name, str) and name.startswith("gpuwatch.") and name != __name__:
                return True
        frame = frame.f_back
    return False


def _auto_start() -> None:
    try:
        if _imported_by_gpuwatch():
            return
        if "gpuwatch.daemon" in sys.modules or "gpuwatch.cli" in sys.modules:
            return  # the daemon itself
    except Exception:
        return  # cannot tell: stay off rather than start where we should not
    start()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)

_auto_start()
