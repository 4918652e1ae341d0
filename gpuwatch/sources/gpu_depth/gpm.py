"""GPM (Hopper and newer): SM activity and occupancy, tensor activity, DRAM bandwidth and
PCIe/NVLink throughput between two GPM samples, one per slow-tier read."""

from __future__ import annotations

from typing import Any

import pynvml

MIB = 1024 * 1024

# metric id -> (GpuSample field, scale): NVML gives percentages and MiB/s.
METRICS = {
    pynvml.NVML_GPM_METRIC_SM_UTIL: ("gpm_sm_active_ratio", 0.01),
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: ("gpm_sm_occupancy_ratio", 0.01),
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("gpm_tensor_active_ratio", 0.01),
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: ("gpm_dram_bandwidth_ratio", 0.01),
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: ("gpm_pcie_tx_bytes_per_second", MIB),
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: ("gpm_pcie_rx_bytes_per_second", MIB),
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: ("gpm_nvlink_tx_bytes_per_second", MIB),
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: ("gpm_nvlink_rx_bytes_per_second", MIB),
}


def metrics_between(prev: Any, cur: Any) -> dict[str, float]:
    get = pynvml.c_nvmlGpmMetricsGet_t()
    get.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    get.numMetrics = len(METRICS)
    get.sample1 = prev
    get.sample2 = cur
    for i, metric in enumerate(METRICS):
        get.metrics[i].metricId = metric
    pynvml.nvmlGpmMetricsGet(get)
    out: dict[str, float] = {}
    for i in range(len(METRICS)):
        m = get.metrics[i]
        if m.nvmlReturn == pynvml.NVML_SUCCESS and m.metricId in METRICS:
            field, scale = METRICS[m.metricId]
            out[field] = max(0.0, float(m.value)) * scale
    return out


class Gpm:
    name = "gpm"
    tier = "slow"

    def __init__(self) -> None:
        self._prev: Any = None
        self._checked = False

    def read(self, dev: Any) -> dict[str, Any]:
        if "gpm" in dev.unsupported:
            return {}
        if not self._checked:
            support = dev.get("gpm", pynvml.nvmlGpmQueryDeviceSupport)
            if support is None:
                return {}
            self._checked = True
            if not support.isSupportedDevice:
                dev.unsupported.add("gpm")
                return {}
        cur = pynvml.nvmlGpmSampleAlloc()
        if dev.get("gpm_sample", pynvml.nvmlGpmSampleGet, cur) is None:
            pynvml.nvmlGpmSampleFree(cur)
            return {}
        prev, self._prev = self._prev, cur
        if prev is None:
            return {}  # the first read only starts the interval
        try:
            return metrics_between(prev, cur)
        except pynvml.NVMLError:
            return {}
        finally:
            pynvml.nvmlGpmSampleFree(prev)
