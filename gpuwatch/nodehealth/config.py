"""Settings of the NVSentinel publisher ([nvsentinel])."""

from __future__ import annotations

from typing import Annotated

import msgspec

DEFAULT_SOCKET = "/var/run/nvsentinel/platform-connector.sock"
STRATEGIES = ("EXECUTE_REMEDIATION", "STORE_ONLY")
REBOOT_ACTIONS = ("RESTART_BM", "RESTART_VM")


class NvSentinelConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Off by default: HealthEvents to NVSentinel's platform connector on this node."""

    enabled: bool = False
    # The platform connector's gRPC Unix socket.
    socket: str = DEFAULT_SOCKET
    # The node the events name (GPUWATCH_NVSENTINEL_NODE_NAME from the downward API's
    # spec.nodeName); "" = this host's name.
    node_name: str = ""
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=30)] = 5.0
    # EXECUTE_REMEDIATION: NVSentinel may quarantine, drain and remediate on fatal events;
    # STORE_ONLY: it records them and changes nothing.
    processing_strategy: str = "EXECUTE_REMEDIATION"
    # What "reboot the node" is called where the node is a VM.
    reboot_action: str = "RESTART_BM"

    def __post_init__(self) -> None:
        if self.processing_strategy not in STRATEGIES:
            raise ValueError(f"processing_strategy: one of {', '.join(STRATEGIES)}")
        if self.reboot_action not in REBOOT_ACTIONS:
            raise ValueError(f"reboot_action: one of {', '.join(REBOOT_ACTIONS)}")
