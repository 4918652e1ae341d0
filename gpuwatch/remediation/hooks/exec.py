"""Run a configured argv (never through a shell) with the event in its environment and as
JSON on stdin, under a timeout that kills its whole process group."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from gpuwatch.remediation.hooks import HookFailed

# Only these are inherited from the daemon: its environment may hold secrets (the webhook
# token, engine bearer tokens) that a hook has no business seeing.
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME")
ENV_PREFIX = "GPUWATCH_EVENT_"
OUTPUT_TAIL_BYTES = 2048
MAX_ENV_VALUE = 4096
KILL_GRACE_SECONDS = 2.0


def environment(payload: Mapping[str, Any], extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    env.update(extra)
    for key, value in payload.items():
        if value is None or isinstance(value, dict | list):
            continue
        # One environment string may not exceed 128 KiB; the full value is on stdin.
        env[ENV_PREFIX + key.upper()] = str(value)[:MAX_ENV_VALUE]
    return env


async def run(argv: Sequence[str], payload: Mapping[str, Any], *, timeout: float,
              extra_env: Mapping[str, str] | None = None) -> dict:
    """payload: flat event/target fields (GPUWATCH_EVENT_<KEY> variables) plus anything nested,
    all of it as one JSON object on stdin. Returns the exit status and output tails."""
    if not argv:
        raise HookFailed("remediation.exec.argv is empty")
    data = msgspec.json.encode(dict(payload))
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=environment(payload, extra_env or {}),
            start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        raise HookFailed(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
    out_task = asyncio.ensure_future(_tail(proc.stdout))
    err_task = asyncio.ensure_future(_tail(proc.stderr))
    try:
        await asyncio.wait_for(_feed_and_wait(proc, data), timeout)
    except (TimeoutError, asyncio.CancelledError) as exc:
        await _kill_group(proc)
        out_task.cancel()
        err_task.cancel()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise HookFailed(f"timed out after {timeout:g}s; process group killed") from None
    stdout, stderr = await out_task, await err_task
    detail = {"argv": list(argv), "exit_code": proc.returncode,
              "stdout_tail": stdout, "stderr_tail": stderr}
    if proc.returncode != 0:
        raise HookFailed(f"exited with status {proc.returncode}: {stderr.strip()[-200:]}")
    return detail


async def _feed_and_wait(proc: asyncio.subprocess.Process, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.close()
    await proc.wait()


async def _tail(stream: asyncio.StreamReader) -> str:
    buf = b""
    while chunk := await stream.read(65536):
        buf = (buf + chunk)[-OUTPUT_TAIL_BYTES:]
    return buf.decode(errors="replace")


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the group, then SIGKILL whatever of it is left after a grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), KILL_GRACE_SECONDS)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()
