"""What an XID means and what to do about it.

Descriptions and immediate actions follow NVIDIA's Xid catalog for Ampere and newer GPUs
("Analyzing Xid Errors with the Xid Catalog", docs.nvidia.com/deploy/xid-errors/, its
"Resolution Bucket (Immediate Action)" column), folded into a few action classes an operator
can route on:

- `restart_app`: the application's own fault or a contained error; the GPU is healthy.
- `reset_gpu`: drain the GPU and reset it (nvidia-smi -r) or reload the driver.
- `reboot_node`: the GPU cannot be recovered in place (off the bus, fabric/PCIe failure).
- `contact_support`: hardware suspected; drain, collect nvidia-bug-report.sh, open a case.
- `none`: informational; nothing to do now.
XIDs the table does not know fall back to `investigate`.
"""

from __future__ import annotations

from typing import NamedTuple

CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


class Xid(NamedTuple):
    description: str
    action: str


XIDS: dict[int, Xid] = {
    8: Xid("GPU stopped processing (channel idle timeout)", "restart_app"),
    13: Xid("Graphics engine exception (application fault)", "restart_app"),
    31: Xid("GPU memory page fault (application fault)", "restart_app"),
    32: Xid("Invalid or corrupted push buffer stream", "restart_app"),
    38: Xid("Driver firmware error", "reset_gpu"),
    43: Xid("GPU stopped processing (application reset its channel)", "none"),
    45: Xid("Preemptive cleanup after an earlier error", "none"),
    48: Xid("Double-bit ECC error (uncorrectable)", "reset_gpu"),
    56: Xid("Display engine error", "reset_gpu"),
    57: Xid("Error programming video memory interface", "reset_gpu"),
    61: Xid("Internal micro-controller breakpoint or warning", "reset_gpu"),
    62: Xid("Internal micro-controller halt", "reset_gpu"),
    63: Xid("Row remapping or page retirement recorded; reset to activate", "reset_gpu"),
    64: Xid("Row remapping or page retirement failed to record", "contact_support"),
    68: Xid("Video decoder (NVDEC) exception", "restart_app"),
    69: Xid("Graphics engine class error", "restart_app"),
    74: Xid("NVLink error", "reset_gpu"),
    79: Xid("GPU has fallen off the bus", "reboot_node"),
    92: Xid("High single-bit ECC error rate", "none"),
    94: Xid("Contained ECC error (only the affected application is hit)", "restart_app"),
    95: Xid("Uncontained ECC error", "reset_gpu"),
    109: Xid("Context switch timeout", "restart_app"),
    110: Xid("Security fault error", "reset_gpu"),
    119: Xid("GSP RPC timeout", "reset_gpu"),
    120: Xid("GSP error", "reset_gpu"),
    121: Xid("C2C link error", "reset_gpu"),
    122: Xid("SPI PMU RPC read failure", "reset_gpu"),
    123: Xid("SPI PMU RPC write failure", "reset_gpu"),
    136: Xid("Link training failed", "reboot_node"),
    140: Xid("Unrecovered ECC error", "reset_gpu"),
    143: Xid("GPU initialization failure", "contact_support"),
    144: Xid("NVLink SAW error", "reset_gpu"),
    145: Xid("NVLink RLW error", "reset_gpu"),
    146: Xid("NVLink TLW error", "reset_gpu"),
    147: Xid("NVLink TREX error", "reset_gpu"),
    148: Xid("NVLink NVLPW control error", "reset_gpu"),
    149: Xid("NVLink NETIR error", "reset_gpu"),
    150: Xid("NVLink MSE error", "reset_gpu"),
    154: Xid("GPU recovery action changed (see gpuwatch_gpu_recovery_action)", "none"),
    155: Xid("NVLink software-defined error", "reset_gpu"),
}

ACTIONS = ("none", "restart_app", "reset_gpu", "reboot_node", "contact_support", "investigate")
UNKNOWN = Xid("not in gpuwatch's XID table: see NVIDIA's Xid catalog", "investigate")


def describe(code: int) -> Xid:
    return XIDS.get(code, UNKNOWN)


# nvmlDeviceGpuRecoveryAction_t, exported as gpuwatch_gpu_recovery_action.
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
