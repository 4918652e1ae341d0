"""GPU hardware health alerts: row remapping, throttling, recovery action, NVLink, fabric and
XIDs routed by the action they call for. Each says what to do, not only what happened."""

from __future__ import annotations

from gpuwatch.monitoring.rule_base import Alert, RuleParams, _new_or_increased
from gpuwatch.xid import RECOVERY_ACTIONS

# the operator-facing XID classes that mean the GPU itself needs attention
XID_HARDWARE_ACTIONS = ("reset_gpu", "reboot_node", "contact_support", "investigate")


def hardware_alerts(p: RuleParams) -> list[Alert]:
    j = f'job="{p.job}"'
    ident = "{{ $labels.instance }} GPU {{ $labels.gpu }} ({{ $labels.uuid }})"
    reasons = "gpuwatch_gpu_clocks_event_reasons"
    actions = ", ".join(f"{k} {v}" for k, v in RECOVERY_ACTIONS.items())
    hw_xid = (f'gpuwatch_gpu_xid_errors_total{{{j},'
              f'action=~"{"|".join(XID_HARDWARE_ACTIONS)}"}}')
    app_xid = f'gpuwatch_gpu_xid_errors_total{{{j},action="restart_app"}}'
    return [
        Alert("GpuwatchGpuXidError", _new_or_increased(hw_xid, "10m"), "critical",
              "A GPU reported an XID that needs action on the GPU.",
              f"{ident} reported XID {{{{ $labels.xid }}}} in the last 10 minutes; NVIDIA's "
              "catalog says: {{ $labels.action }}. gpuwatch_xid_info has the description.",
              "0m"),
        Alert("GpuwatchGpuXidApplicationError", _new_or_increased(app_xid, "10m"), "warning",
              "An application on a GPU hit an XID of its own making.",
              f"{ident} reported XID {{{{ $labels.xid }}}}: the GPU is healthy; restart the "
              "application that faulted.", "0m"),
        Alert("GpuwatchGpuRowRemapPending",
              f'gpuwatch_gpu_remapped_rows{{{j},kind="pending"}} == 1', "warning",
              "A GPU has a row remap pending.",
              f"{ident} marked a memory row for remapping; drain it and reset the GPU to apply "
              "the remap before more errors accumulate.", "15m"),
        Alert("GpuwatchGpuRowRemapFailure",
              f'gpuwatch_gpu_remapped_rows{{{j},kind="failure"}} == 1', "critical",
              "A GPU failed to remap a memory row.",
              f"{ident} could not remap a faulty row: take it out of service and contact "
              "support (RMA).", "0m"),
        Alert("GpuwatchGpuThermalThrottling",
              f'{reasons}{{{j},reason=~"hw_thermal_slowdown|sw_thermal_slowdown"}} == 1',
              "warning", "A GPU is thermally throttled.",
              f"{ident} has held its clocks down for {{{{ $labels.reason }}}} for 10 minutes: "
              "check cooling, airflow and inlet temperature.", "10m"),
        Alert("GpuwatchGpuPowerBrake",
              f'{reasons}{{{j},reason="hw_power_brake_slowdown"}} == 1', "critical",
              "A GPU is held down by the power brake.",
              f"{ident} has been slowed by the external power brake for 5 minutes: check the "
              "node's power supplies and the rack's power budget.", "5m"),
        Alert("GpuwatchGpuRecoveryAction", f"gpuwatch_gpu_recovery_action{{{j}}} > 0",
              "critical", "The driver asks for a recovery action on a GPU.",
              f"The driver recommends recovery action {{{{ $value }}}} for {ident} ({actions}): "
              "drain the GPU and carry it out.", "0m"),
        Alert("GpuwatchGpuNvlinkErrors",
              f"sum by (job, instance, gpu, uuid) "
              f"(rate(gpuwatch_gpu_nvlink_errors_total{{{j}}}[10m])) > "
              f"{p.nvlink_errors_per_second}", "warning",
              "NVLink errors on a GPU keep growing.",
              f"{ident} counts {{{{ $value | humanize }}}} NVLink CRC/replay/recovery errors per "
              "second: check the links (nvidia-smi nvlink -e) and plan a reset.", "10m"),
        Alert("GpuwatchGpuFabricUnhealthy", f"gpuwatch_gpu_fabric_healthy{{{j}}} == 0",
              "critical", "A GPU's NVLink fabric is not healthy.",
              f"{ident} finished fabric registration with an error or degraded bandwidth: "
              "check the fabric manager and the NVSwitches.", "5m"),
    ]
