"""A simulated NVML host behind the same backend interface (`gpuwatch run --simulate`).

Deterministic for a given seed and sampling times: every value is a function of the time
since the first sample, so two runs (or a run and its replay) agree.
"""

from __future__ import annotations

import math

from gpuwatch.model import EngineSample, GpuSample, ProbeSample, ProcessSample
from gpuwatch.sources.simulate import scenarios
from gpuwatch.sources.simulate.engine_text import vllm_exposition
from gpuwatch.sources.simulate.trajectory import GIB, MIB, ProcessSpec, generation, used_bytes
from gpuwatch.sources.simulate.workload import CYCLING, QUEUE_MEDIAN, Traffic

CONTEXT_BYTES = 500 * MIB  # CUDA context and non-PyTorch allocations per process
SCENARIOS = tuple(scenarios.SCENARIOS)
SIM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# A simulated fleet's hosts differ as a real one's do: a seed other than 0 picks the model a
# host's engine serves and how loaded it is, at a steady load (its queue times, and so its
# TTFT and E2E, scale with it), so that a window of any length stands for the host. Seed 0
# is the default host: SIM_MODEL, its load cycling through QUEUE_MEDIANS.
SIM_MODELS = (SIM_MODEL, "Qwen/Qwen2.5-7B-Instruct")
SIM_LOADS = (1.0, 0.4, 0.6, 0.8, 3.0)


def engine_profile(seed: int) -> tuple[str, Traffic]:
    """(model, traffic) of the simulated engines of a host with this seed."""
    if seed == 0:
        return SIM_MODEL, CYCLING
    return (SIM_MODELS[seed % len(SIM_MODELS)],
            Traffic(SIM_LOADS[seed % len(SIM_LOADS)], (QUEUE_MEDIAN,)))


def _host_figures(spec: ProcessSpec, age: float) -> dict:
    """A serving process's host side: most of a core busy feeding the GPU, a few GiB resident
    (the framework, the tokenizer, pinned staging buffers)."""
    busy = 0.55 + 0.02 * (spec.slot % 10)
    return {"cpu_ratio": busy, "cpu_seconds_total": round(busy * max(age, 0.0), 1),
            "resident_memory_bytes": int((2.0 + 0.25 * (spec.slot % 8)) * GIB)}


def _pid(spec: ProcessSpec, gen: int) -> int:
    return 40000 + spec.slot * 1000 + gen


class SimulatedBackend:
    name = "simulate"
    driver_version = "580.00.00-simulated"

    def __init__(self, scenario: str, seed: int = 0, interval: float = 2.0,
                 real_pids: dict[str, int] | None = None) -> None:
        self.scenario = scenarios.get(scenario)
        self.real_pids = dict(real_pids or {})
        self.seed = seed
        self.model, self.traffic = engine_profile(seed)
        self.interval = interval
        self.start: float | None = None
        self._last_engines: float | None = None
        # sample, probes and engines of one tick ask for the same instant: computed once
        self._alive_at: tuple[float, list] | None = None

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _elapsed(self, now: float) -> float:
        if self.start is None:
            self.start = now
        return now - self.start

    def _alive(self, elapsed: float) -> list:
        """(gpu index, spec, generation, age, used bytes, phase) of every running process."""
        memo = self._alive_at
        if memo is None or memo[0] != elapsed:
            memo = self._alive_at = (elapsed, list(self._running(elapsed)))
        return memo[1]

    def _running(self, elapsed: float):
        k = int(elapsed // self.interval)
        for g, gpu in enumerate(self.scenario.gpus):
            for spec in gpu.processes:
                life = generation(spec, elapsed)
                if life is None:
                    continue
                gen, age = life
                used, phase = used_bytes(spec, age, self.seed, k)
                yield g, spec, gen, age, used + CONTEXT_BYTES, phase

    def sample(self, now: float) -> list[GpuSample]:
        elapsed = self._elapsed(now)
        out = []
        alive = self._alive(elapsed)
        for g, gpu in enumerate(self.scenario.gpus):
            model = gpu.model
            name, total = model.name, model.total_bytes
            procs = [
                ProcessSample(
                    pid=self._pid(spec, gen), name=spec.name, user=spec.user,
                    used_memory_bytes=int(used),
                    create_time=self._create_time(spec, round(now - age, 3)),
                    **_host_figures(spec, age),
                )
                for gi, spec, gen, age, used, _ in alive if gi == g
            ]
            used = min(sum(p.used_memory_bytes or 0 for p in procs) + 64 * MIB,
                       total - gpu.reserved_bytes)
            util = 0.0 if not procs else 0.55 + 0.35 * math.sin(elapsed / 37.0 + g)
            out.append(GpuSample(
                index=g, uuid=self._uuid(g),
                name=name, pci_bus_id=f"00000000:{0x18 + g * 0x10:02X}:00.0",
                memory_total_bytes=total, memory_used_bytes=int(used),
                memory_free_bytes=int(total - gpu.reserved_bytes - used),
                memory_reserved_bytes=gpu.reserved_bytes,
                utilization_ratio=round(util, 2), memory_utilization_ratio=round(util * 0.6, 2),
                temperature_celsius=round(38 + 30 * util),
                # what the model draws, from idle to near its own limit
                power_watts=round(model.idle_watts + (0.9 * model.power_limit_watts
                                                      - model.idle_watts) * util, 1),
                power_limit_watts=model.power_limit_watts,
                memory_temperature_celsius=round(42 + 28 * util) if model.hbm else None,
                fan_speed_ratio=round(0.3 + 0.5 * util, 2) if model.fans else None,
                performance_state=0 if util > 0.05 else 8,
                encoder_utilization_ratio=0.0, decoder_utilization_ratio=0.0,
                jpeg_utilization_ratio=0.0, ofa_utilization_ratio=0.0,
                sm_clock_hz=1980e6 if util > 0.05 else 345e6,
                memory_clock_hz=2619e6, clocks_event_reasons=1 if util <= 0.05 else 0,
                ecc_volatile_corrected_total=0, ecc_volatile_uncorrected_total=0,
                remapped_rows_correctable=0, remapped_rows_uncorrectable=0,
                remapped_rows_pending=False, remapped_rows_failure=False,
                processes=procs,
            ))
        return out

    def _pid(self, spec: ProcessSpec, gen: int) -> int:
        return self.real_pids.get(spec.name) or _pid(spec, gen)

    def attribution_host(self):
        """The simulated node's cgroups and kubelet, when the scenario places pods; None
        otherwise (simulated pids must never be looked up in the real /proc)."""
        pods = self.scenario.extra.get("pods")
        if not pods:
            return None
        from gpuwatch.sources.simulate.kubernetes import SimulatedNode

        def locate(pid: int):
            slot, gen = divmod(pid - 40000, 1000)
            return (slot, gen) if pid >= 40000 else None

        node = SimulatedNode(pods, locate)
        node.gpus = [(self._uuid(g), [s.slot for s in gpu.processes])
                     for g, gpu in enumerate(self.scenario.gpus)]
        return node

    def _uuid(self, g: int) -> str:
        return f"GPU-5150{g:04d}-sim0-4a1e-9000-{self.seed:012d}"

    def _create_time(self, spec: ProcessSpec, simulated: float) -> float:
        """A process standing in for a real pid carries that process's identity."""
        pid = self.real_pids.get(spec.name)
        if pid is None:
            return simulated
        import psutil

        try:
            return psutil.Process(pid).create_time()
        except psutil.Error:
            return simulated

    def sample_slow(self, now: float) -> dict[str, dict]:
        elapsed = self._elapsed(now)
        out = {}
        for g, spec in zip(self.sample(now), self.scenario.gpus, strict=True):
            fields = {
                "energy_joules_total": round(300.0 * elapsed, 1),
                "pcie_tx_bytes_per_second": 2.0e8 * (1 + math.sin(elapsed / 13.0)),
                "pcie_rx_bytes_per_second": 6.0e8 * (1 + math.cos(elapsed / 11.0)),
                "mig_mode": False,
                "recovery_action": 0,
            }
            if spec.model.hbm:
                fields["memory_temperature_max_celsius"] = 95.0
            if "H100" in g.name or "H200" in g.name:  # GPM exists from Hopper on
                busy = g.utilization_ratio or 0.0
                # an SXM board in an NVSwitch system: 18 links up, quiet, fabric registered
                fields.update(nvlink_links_active=18,
                              nvlink_errors_total={"crc": 0, "replay": 0, "recovery": 0},
                              fabric_state="completed", fabric_healthy=True)
                fields.update(gpm_sm_active_ratio=round(0.9 * busy, 3),
                              gpm_sm_occupancy_ratio=round(0.4 * busy, 3),
                              gpm_tensor_active_ratio=round(0.6 * busy, 3),
                              gpm_dram_bandwidth_ratio=round(0.5 * busy, 3))
            out[g.uuid] = fields
        return out

    def probes(self, now: float) -> list[ProbeSample]:
        elapsed = self._elapsed(now)
        out = []
        for g, spec, gen, age, used, _ in self._alive(elapsed):
            if not spec.probe:
                continue
            reserved = max(used - CONTEXT_BYTES, 0)
            # Fragmentation builds up over a minute from 20 s after the scenario started.
            f = min(max((elapsed - 20.0) / 60.0, 0.0), 1.0) if spec.probe == "fragmenting" else 0
            total_free = reserved * (0.08 + 0.30 * f)
            free_blocks = int(12 + 1200 * f)
            largest = total_free * (0.75 - 0.65 * f)
            out.append(ProbeSample(
                pid=self._pid(spec, gen), t=now, device=g, create_time=round(now - age, 3),
                allocated_bytes=int(reserved - total_free), reserved_bytes=int(reserved),
                inactive_split_bytes=int(total_free * (0.2 + 0.75 * f)),
                num_alloc_retries=int(40 * f), num_ooms=0, free_blocks=free_blocks,
                largest_free_block_bytes=int(largest),
                smallest_free_block_bytes=int(min(largest, 2 * MIB if f > 0.1 else 300 * MIB)),
                total_free_bytes=int(total_free), segments=int(reserved // (2 * GIB)) + 3,
            ))
        return out

    def engines(self, now: float) -> list[EngineSample]:
        """Expositions of the simulated engines, every engines_every_seconds."""
        every = self.scenario.engines_every_seconds
        if self._last_engines is not None and now - self._last_engines < every - 1e-6:
            return []
        self._last_engines = now
        elapsed = self._elapsed(now)
        out = []
        for _, spec, gen, age, _, phase in self._alive(elapsed):
            if not spec.engine:
                continue
            text = None if phase == "loading" else vllm_exposition(age, self.model,
                                                                  traffic=self.traffic)
            out.append(EngineSample(
                name=spec.engine, kind="vllm", url=f"simulate://{spec.engine}/metrics",
                exposition=text, error="connection refused (loading)" if text is None else None,
                t=now, duration_seconds=0.001, pids=[self._pid(spec, gen)],
            ))
        return out
