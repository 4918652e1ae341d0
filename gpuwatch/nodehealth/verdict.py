"""What the node tools are told, from one GPU's sample and the daemon's verdicts on it.

Pure: it reads the plain dict forms (/api/state's `sample.gpus[]` and `signals.gpus[uuid]`),
so `gpuwatch npd` (from a running daemon's state) and the NVSentinel publisher (inside the
daemon) judge alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwatch.xid import describe

# Node condition types. NPD sets a condition True when its plugin reports a problem, so they
# are named for the problem, as NPD's own KubeletUnhealthy and ContainerRuntimeUnhealthy are.
GPU_CONDITION = "GpuwatchGpuUnhealthy"
MEMORY_CONDITION = "GpuwatchGpuMemoryPressure"
# XID action classes (gpuwatch/xid.py) that need the GPU or the node acted on.
FATAL_XID_ACTIONS = ("reset_gpu", "reboot_node", "contact_support")
# ... and those that are an Event: the application's own fault, or one nobody has classified.
WARNING_XID_ACTIONS = ("restart_app", "investigate")


@dataclass(frozen=True)
class Finding:
    condition: str  # GPU_CONDITION | MEMORY_CONDITION
    severity: str  # critical: the condition holds; warning: an Event
    fatal: bool  # the GPU or node needs a node tool's action (cordon, drain, reset, reboot)
    action: str  # gpuwatch's action class: reset_gpu | reboot_node | contact_support | ...
    code: str  # XID_79, GPU_LOST, ECC_UNCORRECTABLE, TIME_TO_OOM_CRITICAL, ...
    message: str
    gpu: int
    uuid: str
    pci_bus_id: str = ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def gpu_findings(gpu: dict, signals: dict | None, *,
                 warnings_since: float | None = None) -> list[Finding]:
    """Findings for one GPU, worst first. A warning XID counts only when it was last seen at
    or after `warnings_since` (None: whenever it was seen since the daemon started)."""
    index, uuid = _int(gpu.get("index")), str(gpu.get("uuid") or "")
    pci = str(gpu.get("pci_bus_id") or "")
    out: list[Finding] = []

    def add(condition, severity, fatal, action, code, what):
        out.append(Finding(condition, severity, fatal, action, code,
                           f"GPU {index} ({uuid}): {what}", index, uuid, pci))

    if gpu.get("lost"):
        add(GPU_CONDITION, "critical", True, "reboot_node", "GPU_LOST",
            "fallen off the bus (NVML: GPU is lost); reboot the node")
    xids = gpu.get("xid_events_total") or {}
    seen = gpu.get("xid_last_seen") or {}
    for key in sorted(xids, key=lambda k: (_code(k) is None, _code(k) or 0)):
        code = _code(key)
        if code is None or _int(xids[key]) <= 0:
            continue
        x = describe(code)
        if x.action in FATAL_XID_ACTIONS:
            add(GPU_CONDITION, "critical", True, x.action, f"XID_{code}",
                f"XID {code} x{xids[key]}: {x.description}; {x.action}")
        elif x.action in WARNING_XID_ACTIONS:
            last = seen.get(key)
            if warnings_since is None or (isinstance(last, (int, float))
                                          and last >= warnings_since):
                add(GPU_CONDITION, "warning", False, x.action, f"XID_{code}",
                    f"XID {code} x{xids[key]}: {x.description}; {x.action}")
    if _int(gpu.get("ecc_volatile_uncorrected_total")) > 0:
        add(GPU_CONDITION, "critical", True, "reset_gpu", "ECC_UNCORRECTABLE",
            f"{gpu['ecc_volatile_uncorrected_total']} uncorrectable ECC errors since the "
            "driver loaded; reset the GPU")
    if gpu.get("remapped_rows_failure"):
        add(GPU_CONDITION, "critical", True, "contact_support", "ROW_REMAP_FAILURE",
            "row remapping failed; the GPU needs replacing")
    elif gpu.get("remapped_rows_pending"):
        add(GPU_CONDITION, "critical", True, "reset_gpu", "ROW_REMAP_PENDING",
            "a row remap is pending; reset the GPU to apply it")
    sig = signals or {}
    tto, tto_sev = sig.get("time_to_oom_seconds"), _int(sig.get("time_to_oom_severity"))
    if tto_sev:
        # a warning's text stays the same while it lasts: Kubernetes folds repeated Events
        when = (f"in {tto:.0f} s" if tto_sev >= 2 and isinstance(tto, (int, float))
                else "within the warning horizon" if tto_sev < 2 else "soon")
        add(MEMORY_CONDITION, "critical" if tto_sev >= 2 else "warning", False, "restart_app",
            f"TIME_TO_OOM_{'CRITICAL' if tto_sev >= 2 else 'WARNING'}",
            f"GPU memory runs out {when} at the current leak rate; restart or flush the "
            "leaking process")
    zone = _int(sig.get("zone"))
    if zone:
        add(MEMORY_CONDITION, "critical" if zone >= 2 else "warning", False, "restart_app",
            f"MEMORY_ZONE_{'CRITICAL' if zone >= 2 else 'WARNING'}",
            f"memory in the {'critical' if zone >= 2 else 'warning'} zone of threshold row "
            f"{sig.get('threshold_row') or '?'}")
    rank = {"critical": 0, "warning": 1}
    return sorted(out, key=lambda f: (rank[f.severity], not f.fatal))


def _code(key: Any) -> int | None:
    try:
        code = int(key)
    except (TypeError, ValueError):
        return None
    return code if 0 <= code < 1 << 16 else None


def node_findings(state: dict, *, warnings_since: float | None = None) -> list[Finding]:
    """Every GPU's findings from a /api/state document."""
    sample = state.get("sample") or {}
    sigs = (state.get("signals") or {}).get("gpus") or {}
    out: list[Finding] = []
    for gpu in sample.get("gpus") or ():
        if isinstance(gpu, dict):
            sig = sigs.get(gpu.get("uuid")) if isinstance(sigs, dict) else None
            out += gpu_findings(gpu, sig if isinstance(sig, dict) else None,
                                warnings_since=warnings_since)
    return out
