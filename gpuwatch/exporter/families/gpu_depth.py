"""GPU series past the basics: MIG, GPM activity, NVLink, fabric, the driver's recovery
action, and per-process utilization. Each is absent where the GPU does not support it."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch.exporter.families.process import PROCESS_LABELS, process_labels
from gpuwatch.exporter.metric import CounterMetricFamily, GaugeMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import ProcessSample

P = "gpuwatch_gpu_"
L = ["gpu", "uuid"]

# (GpuSample field, metric suffix, help)
GPM = (
    ("gpm_sm_active_ratio", "sm_active_ratio", "Share of SMs busy over the GPM interval (0-1)."),
    ("gpm_sm_occupancy_ratio", "sm_occupancy_ratio",
     "Active warps against the theoretical maximum over the GPM interval (0-1)."),
    ("gpm_tensor_active_ratio", "tensor_active_ratio",
     "Share of time the SMs ran any tensor operation over the GPM interval (0-1)."),
    ("gpm_dram_bandwidth_ratio", "dram_bandwidth_utilization_ratio",
     "DRAM bandwidth used against its theoretical maximum over the GPM interval (0-1)."),
    ("gpm_pcie_tx_bytes_per_second", "gpm_pcie_tx_bytes_per_second",
     "PCIe transmit throughput over the GPM interval."),
    ("gpm_pcie_rx_bytes_per_second", "gpm_pcie_rx_bytes_per_second",
     "PCIe receive throughput over the GPM interval."),
    ("gpm_nvlink_tx_bytes_per_second", "nvlink_tx_bytes_per_second",
     "NVLink transmit throughput, all links, over the GPM interval."),
    ("gpm_nvlink_rx_bytes_per_second", "nvlink_rx_bytes_per_second",
     "NVLink receive throughput, all links, over the GPM interval."),
)
FABRIC_STATES = ("not_started", "in_progress", "completed")
PROCESS_UTIL = (("sm_ratio", "sm"), ("memory_ratio", "memory"), ("encoder_ratio", "encoder"),
                ("decoder_ratio", "decoder"))


def collect(snap: Snapshot) -> Iterator[Metric]:
    tick = snap.tick
    if tick is None:
        return
    mig_mode = GaugeMetricFamily(P + "mig_mode", "1 when MIG is enabled on the GPU.", labels=L)
    mig_info = GaugeMetricFamily(
        P + "mig_info", "A MIG instance, sampled as a GPU of its own under its MIG uuid "
        "(value 1); join on uuid for its memory, zone and leak series.",
        labels=[*L, "parent_uuid", "mig_instance", "mig_profile"])
    gpm = {f: GaugeMetricFamily(P + m, h, labels=L) for f, m, h in GPM}
    links = GaugeMetricFamily(P + "nvlink_links_active", "NVLink links that are up.", labels=L)
    link_errors = CounterMetricFamily(P + "nvlink_errors", "NVLink errors summed over links, "
                                      "by kind (crc, replay, recovery).", labels=[*L, "kind"])
    fabric = GaugeMetricFamily(P + "fabric_state", "1 for the GPU's fabric registration state.",
                               labels=[*L, "state"])
    fabric_ok = GaugeMetricFamily(P + "fabric_healthy", "1 when the fabric registration "
                                  "completed without error or degraded bandwidth.", labels=L)
    recovery = GaugeMetricFamily(
        P + "recovery_action", "The driver's recommended recovery action "
        "(0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset, "
        "5 recover IMEX domain, 6 bus reset, 7 system reboot).", labels=L)
    util = GaugeMetricFamily(
        "gpuwatch_process_utilization_ratio", "The process's share of the GPU's engines over "
        "the last slow-tier period, by engine (sm, memory, encoder, decoder).",
        labels=[*PROCESS_LABELS, "engine"])
    for g in tick.gpus:
        if g.lost:
            continue
        lv = [str(g.index), g.uuid]
        if g.mig_mode is not None:
            mig_mode.add_metric(lv, 1 if g.mig_mode else 0)
        if g.mig_parent_uuid:
            mig_info.add_metric([*lv, g.mig_parent_uuid, g.mig_instance, g.mig_profile], 1)
        for f, _, _ in GPM:
            v = getattr(g, f)
            if v is not None:
                gpm[f].add_metric(lv, v)
        if g.nvlink_links_active is not None:
            links.add_metric(lv, g.nvlink_links_active)
        for kind, count in sorted(g.nvlink_errors_total.items()):
            link_errors.add_metric([*lv, kind], count)
        if g.fabric_state:
            for state in FABRIC_STATES:
                fabric.add_metric([*lv, state], 1 if g.fabric_state == state else 0)
        if g.fabric_healthy is not None:
            fabric_ok.add_metric(lv, 1 if g.fabric_healthy else 0)
        if g.recovery_action is not None:
            recovery.add_metric(lv, g.recovery_action)
        if g.process_utilization:
            procs = {p.pid: p for p in g.processes}
            for u in g.process_utilization:
                # Only processes of this tick: an exited pid takes its series with it.
                proc: ProcessSample | None = procs.get(u.pid)
                if proc is None:
                    continue
                pl = process_labels(g, proc)
                for field, engine in PROCESS_UTIL:
                    v = getattr(u, field)
                    if v is not None:
                        util.add_metric([*pl, engine], v)
    yield mig_mode
    yield mig_info
    yield from gpm.values()
    yield from (links, link_errors, fabric, fabric_ok, recovery, util)
