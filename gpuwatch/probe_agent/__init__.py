"""The in-process probe's implementation: the agent thread (agent), what it reads from the
allocator (stats), what it does on request (actions), and start/stop/current below.

Importing this package or its modules starts nothing; `import gpuwatch.probe` (the user's
entry point) and the vLLM plugin call start(). Nothing here raises into the host program.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import TYPE_CHECKING

from gpuwatch.probe_channel.config import ProbeConfig

if TYPE_CHECKING:
    from gpuwatch.probe_agent.agent import Agent

__all__ = ["ENABLE_VAR", "ProbeConfig", "current", "start", "stop"]

log = logging.getLogger("gpuwatch.probe")

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
        from gpuwatch.probe_channel.config import from_environ, is_false

        if is_false(os.environ.get(ENABLE_VAR, "")):
            return None
        with _lock:
            running = _agent is not None and _agent.pid == os.getpid() and _agent.running
            if running and (config is None or config == _agent.config):
                return _agent
            if running:
                _agent.stop()
            from gpuwatch.probe_agent.agent import Agent

            agent = Agent(config if config is not None else from_environ())
            agent.start()
            _agent = agent
            if not _atexit_registered:
                atexit.register(_stop_at_exit)
                _atexit_registered = True
            return agent
    except Exception as exc:
        log.warning("gpuwatch probe not started: %s: %s", type(exc).__name__, exc)
        return None


def stop(timeout: float = 5.0, _exiting: bool = False) -> None:
    """Stop the probe and remove its record; never raises."""
    global _agent
    try:
        with _lock:
            agent, _agent = _agent, None
        if agent is not None and agent.pid == os.getpid():
            agent.stop(timeout, exiting=_exiting)
    except Exception as exc:
        log.warning("gpuwatch probe: stop: %s: %s", type(exc).__name__, exc)


def _stop_at_exit() -> None:
    stop(_exiting=True)


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


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
