"""GPU series: identity, memory, utilization, thermals, clocks and health."""

from __future__ import annotations

from collections.abc import Iterator

from gpuwatch.exporter.metric import CounterMetricFamily, GaugeMetricFamily, Metric
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.xid import describe

P = "gpuwatch_gpu_"
L = ["gpu", "uuid"]

# NVML clocks-event reason bits -> label values (nvmlClocksEventReason*).
CLOCKS_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# (GpuSample field, metric suffix, help, scale)
GAUGES = (
    ("memory_total_bytes", "memory_total_bytes", "Total GPU memory.", 1),
    ("memory_used_bytes", "memory_used_bytes",
     "GPU memory used (NVML memory-info v2: excludes driver-reserved memory).", 1),
    ("memory_free_bytes", "memory_free_bytes", "GPU memory free.", 1),
    ("memory_reserved_bytes", "memory_reserved_bytes",
     "GPU memory reserved by the driver (NVML memory-info v2).", 1),
    ("utilization_ratio", "utilization_ratio",
     "Share of the last sample period a kernel ran on the GPU (0-1).", 1),
    ("memory_utilization_ratio", "memory_bandwidth_utilization_ratio",
     "Share of the last sample period device memory was read or written (0-1).", 1),
    ("temperature_celsius", "temperature_celsius", "GPU core temperature.", 1),
    ("memory_temperature_celsius", "memory_temperature_celsius",
     "HBM temperature (absent where the board has no memory sensor).", 1),
    ("memory_temperature_max_celsius", "memory_temperature_max_celsius",
     "HBM temperature at which the GPU slows down.", 1),
    ("fan_speed_ratio", "fan_speed_ratio",
     "Fan speed the board asks for, 0-1 (absent where it has no fans: SXM, passive).", 1),
    ("performance_state", "performance_state",
     "Performance state: 0 (P0, most performance) to 15 (P15, least).", 1),
    ("power_watts", "power_watts", "Power draw.", 1),
    ("power_limit_watts", "power_limit_watts", "Enforced power limit.", 1),
    ("sm_clock_hz", "sm_clock_hertz", "SM clock.", 1),
    ("memory_clock_hz", "memory_clock_hertz", "Memory clock.", 1),
    ("pcie_tx_bytes_per_second", "pcie_tx_bytes_per_second", "PCIe transmit throughput.", 1),
    ("pcie_rx_bytes_per_second", "pcie_rx_bytes_per_second", "PCIe receive throughput.", 1),
)

MEDIA_ENGINES = (("encoder_utilization_ratio", "encoder"),
                 ("decoder_utilization_ratio", "decoder"),
                 ("jpeg_utilization_ratio", "jpeg"), ("ofa_utilization_ratio", "ofa"))


def collect(snap: Snapshot) -> Iterator[Metric]:
    tick = snap.tick
    if tick is None:
        return
    driver = getattr(snap, "extras", {}).get("driver_version", "")
    info = GaugeMetricFamily(
        P + "info", "GPU identity (value 1); join on uuid.",
        labels=["gpu", "uuid", "name", "pci_bus_id", "driver_version"],
    )
    lost = GaugeMetricFamily(P + "lost", "1 when NVML reports the GPU lost (isolated).",
                             labels=L)
    gauges = {f: GaugeMetricFamily(P + m, h, labels=L) for f, m, h, _ in GAUGES}
    reasons = GaugeMetricFamily(
        P + "clocks_event_reasons",
        "1 for each reason the clocks are currently held down (throttling), by reason.",
        labels=[*L, "reason"],
    )
    ecc = CounterMetricFamily(P + "ecc_errors", "Volatile ECC errors since the last driver "
                              "reload.", labels=[*L, "type"])
    remapped = GaugeMetricFamily(P + "remapped_rows", "Remapped memory rows, by kind "
                                 "(correctable, uncorrectable; pending and failure are 0/1).",
                                 labels=[*L, "kind"])
    xid = CounterMetricFamily(P + "xid_errors", "XID critical-error events seen since the "
                              "daemon started, by XID code and the action it calls for.",
                              labels=[*L, "xid", "action"])
    xid_info = GaugeMetricFamily("gpuwatch_xid_info", "What an XID seen on this host means "
                                 "and what to do (value 1).",
                                 labels=["xid", "description", "action"])
    media = GaugeMetricFamily(
        P + "media_engine_utilization_ratio",
        "Share of NVML's sampling period each media engine was busy (0-1), by engine.",
        labels=[*L, "engine"])
    seen: set[int] = set()
    energy = CounterMetricFamily(P + "energy_joules", "Energy consumed since the driver "
                                 "loaded.", labels=L)
    for g in tick.gpus:
        lv = [str(g.index), g.uuid]
        info.add_metric([str(g.index), g.uuid, g.name, g.pci_bus_id, driver], 1)
        lost.add_metric(lv, 1 if g.lost else 0)
        if g.lost:
            continue
        for f, _, _, scale in GAUGES:
            v = getattr(g, f)
            if v is not None:
                gauges[f].add_metric(lv, v * scale)
        for field, engine in MEDIA_ENGINES:
            v = getattr(g, field)
            if v is not None:
                media.add_metric([*lv, engine], v)
        if g.clocks_event_reasons is not None:
            for bit, name in CLOCKS_EVENT_REASONS.items():
                reasons.add_metric([*lv, name], 1 if g.clocks_event_reasons & bit else 0)
        if g.ecc_volatile_corrected_total is not None:
            ecc.add_metric([*lv, "corrected"], g.ecc_volatile_corrected_total)
        if g.ecc_volatile_uncorrected_total is not None:
            ecc.add_metric([*lv, "uncorrected"], g.ecc_volatile_uncorrected_total)
        for kind in ("correctable", "uncorrectable", "pending", "failure"):
            v = getattr(g, f"remapped_rows_{kind}")
            if v is not None:
                remapped.add_metric([*lv, kind], float(v))
        for code, count in sorted(g.xid_events_total.items()):
            what = describe(int(code))
            xid.add_metric([*lv, code, what.action], count)
            if int(code) not in seen:
                seen.add(int(code))
                xid_info.add_metric([code, what.description, what.action], 1)
        if g.energy_joules_total is not None:
            energy.add_metric(lv, g.energy_joules_total)
    yield info
    yield lost
    yield from gauges.values()
    yield from (media, reasons, ecc, remapped, xid, xid_info, energy)
