"""Pure analyzers over ticks: no NVML, no HTTP, no clock reads (replayable)."""
