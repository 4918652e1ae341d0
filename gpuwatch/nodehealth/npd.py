"""`gpuwatch npd CHECK`: a Node Problem Detector custom plugin over a running daemon's state.

NPD's plugin protocol: exit 0 OK, 1 a problem, anything else unknown; the first line of
stdout is the message (NPD cuts it at max_output_length); NPD kills a plugin that outlives the
rule's timeout. Here --timeout bounds the whole run, so the answer is always ours: a daemon
that cannot be asked in time is "unknown", never a hang.
"""

from __future__ import annotations

import json
import signal
import sys
import time

import click

from gpuwatch.views.cli import client_options

OK, PROBLEM, UNKNOWN = 0, 1, 2
MAX_MESSAGE = 240
# check -> (condition it sets, severity it reports)
CHECKS = {
    "gpu-health": ("GpuwatchGpuUnhealthy", "critical"),
    "memory-pressure": ("GpuwatchGpuMemoryPressure", "critical"),
    "warnings": (None, "warning"),
}
NPD_INTERVAL_SECONDS = 30
NPD_TIMEOUT_SECONDS = 10
# where the README's install puts the command (a venv in /opt/gpuwatch)
COMMAND = "/opt/gpuwatch/bin/gpuwatch"
DEFAULT_URL = "http://127.0.0.1:19400"


def judge(check: str, state: dict, now: float, since: float) -> tuple[int, str]:
    """(exit status, message) of one check over a /api/state document."""
    from gpuwatch.nodehealth.verdict import node_findings

    if not state.get("ready"):
        return UNKNOWN, "gpuwatch is not ready yet (no first sample)"
    nvml = (state.get("sources") or {}).get("nvml") or {}
    if isinstance(nvml, dict) and nvml.get("up") is False:
        return UNKNOWN, f"gpuwatch cannot read the GPUs: {nvml.get('reason') or 'NVML down'}"
    gpus = (state.get("sample") or {}).get("gpus") or []
    if not gpus:
        return UNKNOWN, "gpuwatch sees no GPU on this node"
    condition, severity = CHECKS[check]
    found = [f for f in node_findings(state, warnings_since=now - since)
             if f.severity == severity and (condition is None or f.condition == condition)]
    if not found:
        what = {"gpu-health": "every GPU healthy", "memory-pressure": "GPU memory sufficient",
                "warnings": "no GPU warning"}[check]
        return OK, f"gpuwatch: {what} ({len(gpus)} GPUs)"
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return PROBLEM, f"{found[0].code}: {found[0].message}{more}"


def _one_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_MESSAGE else line[:MAX_MESSAGE - 3] + "..."


def _finish(status: int, message: str) -> None:
    sys.stdout.write(_one_line(message) + "\n")
    sys.stdout.flush()
    sys.exit(status)


@click.command("npd")
@click.argument("check", type=click.Choice(sorted(CHECKS)))
@click.option("--url", help="The daemon (default: the configured listen address on this host).")
@click.option("--timeout", type=click.FloatRange(min=0.1, max=600), default=5.0,
              show_default=True, help="Seconds the whole check may take; then: unknown.")
@click.option("--since", type=click.FloatRange(min=1), default=float(NPD_INTERVAL_SECONDS),
              show_default=True, metavar="S",
              help="warnings: XIDs seen within the last S seconds (NPD's invoke_interval).")
@client_options
def npd(check, url, timeout, since, user, password_file, cacert, config_file) -> None:
    """Node Problem Detector custom-plugin mode: gpu-health (XIDs that need the GPU or node
    acted on, uncorrectable ECC, row remapping, a GPU off the bus), memory-pressure (time to
    OOM or memory zone critical), warnings (application XIDs, warning levels). Exit 0 OK,
    1 problem, 2 unknown; one line of message."""
    from gpuwatch.views import cli as views_cli
    from gpuwatch.views import terminal

    deadline = time.monotonic() + timeout

    def expired(signum, frame):
        _finish(UNKNOWN, f"gpuwatch npd {check}: no answer within {timeout:g} s")

    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    if password_file and not user:
        raise click.BadParameter("needs --user", param_hint="--password-file")
    url = url or (views_cli._local_url(config_file) if config_file else DEFAULT_URL)
    try:
        terminal.check_url(url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--url") from None
    auth = (user, views_cli._password(password_file)) if user else None
    try:
        state = terminal.fetch_state(url, timeout=max(0.05, deadline - time.monotonic()),
                                     auth=auth, cafile=cacert)
    except terminal.StatusError as exc:
        _finish(UNKNOWN, f"gpuwatch npd {check}: {exc}")
    except (OSError, ValueError) as exc:  # a CA file that does not load, say
        _finish(UNKNOWN, f"gpuwatch npd {check}: {exc}")
    signal.setitimer(signal.ITIMER_REAL, 0)
    status, message = judge(check, state, time.time(), since)
    _finish(status, message)


def monitor(command: str = COMMAND, url: str = DEFAULT_URL) -> dict:
    """NPD's custom-plugin-monitor configuration for the three checks."""
    plugin_timeout = NPD_TIMEOUT_SECONDS - 2  # ours ends first: NPD reads our "unknown"

    def rule(kind: str, check: str, reason: str, condition: str | None = None) -> dict:
        r = {"type": kind, "reason": reason, "path": command,
             "args": ["npd", check, "--url", url, "--timeout", str(plugin_timeout)]
             + (["--since", str(NPD_INTERVAL_SECONDS)] if check == "warnings" else []),
             "timeout": f"{NPD_TIMEOUT_SECONDS}s"}
        if condition:
            r["condition"] = condition
        return r

    return {
        "plugin": "custom",
        "pluginConfig": {
            "invoke_interval": f"{NPD_INTERVAL_SECONDS}s",
            "timeout": f"{NPD_TIMEOUT_SECONDS}s",
            "max_output_length": MAX_MESSAGE,
            "concurrency": 1,
            # a condition is written when its status changes, not on every new message: one
            # node-status update per transition
            "enable_message_change_based_condition_update": False,
        },
        "source": "gpuwatch-custom-plugin-monitor",
        "metricsReporting": True,
        "conditions": [
            {"type": "GpuwatchGpuUnhealthy", "reason": "GpuwatchGpusHealthy",
             "message": "gpuwatch finds every GPU healthy"},
            {"type": "GpuwatchGpuMemoryPressure", "reason": "GpuwatchGpuMemorySufficient",
             "message": "gpuwatch finds GPU memory sufficient"},
        ],
        "rules": [
            rule("permanent", "gpu-health", "GpuwatchGpuNeedsAction", "GpuwatchGpuUnhealthy"),
            rule("permanent", "memory-pressure", "GpuwatchGpuMemoryRunningOut",
                 "GpuwatchGpuMemoryPressure"),
            rule("temporary", "warnings", "GpuwatchGpuWarning"),
        ],
    }


def monitor_json() -> str:
    return json.dumps(monitor(), indent=2) + "\n"
