"""Requests to the in-process probe (gpuwatch.probe_channel.requests), as one awaitable call."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuwatch.remediation.hooks import HookFailed


async def request(probe_dir: str, pid: int, action: str, params: dict[str, Any] | None,
                  timeout: float) -> dict[str, Any]:
    """Send one request and wait for its result; HookFailed when it cannot be had."""
    try:
        from gpuwatch.probe_channel.requests import send_request, wait_result
    except ImportError as exc:
        raise HookFailed(f"probe request channel unavailable ({exc})") from None
    if not probe_dir:
        raise HookFailed("no probe directory configured")
    try:
        request_id = send_request(probe_dir, pid, action, params)
        result = await wait_result(probe_dir, pid, request_id, timeout)
    except TimeoutError:
        raise HookFailed(f"probe in pid {pid} did not answer within {timeout:g}s") from None
    except (OSError, ValueError) as exc:
        raise HookFailed(f"probe request to pid {pid} failed: {exc}") from None
    if not isinstance(result, dict):
        raise HookFailed(f"probe in pid {pid} answered {type(result).__name__}, not an object")
    result["request_id"] = request_id  # ours, whatever the probe put there
    return result


async def copy_snapshot(probe_dir: str, pid: int, request_id: str, dest: str,
                        max_bytes: int) -> int:
    """Copy the snapshot the probe wrote for request_id into dest (off the event loop);
    HookFailed when it cannot be had."""
    from gpuwatch.probe_channel.requests import copy_out

    try:
        return await asyncio.to_thread(copy_out, probe_dir, pid, request_id, dest, max_bytes)
    except (OSError, ValueError) as exc:
        raise HookFailed(f"snapshot of pid {pid} refused: {exc}") from None
