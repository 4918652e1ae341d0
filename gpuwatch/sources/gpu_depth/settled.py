"""What changes only on an event or an operator's command, slow tier: the enforced power limit
(`nvidia-smi -pl`, a power cap), the volatile ECC totals and the remapped rows (a memory
error; XID 48, 63 and 64 tell of one at once through the event set).

Once a second, these four calls cost 36 us of CPU together in the driver (an H100, driver 580:
the cache that makes a repeated call cost 2 us has expired by the next tick); on the slow tier
they cost that once every 30 s."""

from __future__ import annotations

from typing import Any

import pynvml


class Settled:
    name = "settled"
    tier = "slow"

    def read(self, dev: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        limit = dev.get("power_limit", pynvml.nvmlDeviceGetEnforcedPowerLimit)
        if limit is not None:
            out["power_limit_watts"] = limit / 1000.0
        for field, key, kind in (
                ("ecc_corrected", "ecc_volatile_corrected_total",
                 pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("ecc_uncorrected", "ecc_volatile_uncorrected_total",
                 pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            value = dev.get(field, pynvml.nvmlDeviceGetTotalEccErrors, kind,
                            pynvml.NVML_VOLATILE_ECC)
            if value is not None:
                out[key] = value
        rows = dev.get("remapped_rows", pynvml.nvmlDeviceGetRemappedRows)
        if rows is not None:
            corr, unc, pending, failure = rows
            out["remapped_rows_correctable"] = int(corr)
            out["remapped_rows_uncorrectable"] = int(unc)
            out["remapped_rows_pending"] = bool(pending)
            out["remapped_rows_failure"] = bool(failure)
        return out
