"""A Snapshot as one OTLP ExportMetricsServiceRequest (protobuf), with the semantic
conventions' names and units (docs/otlp.md).

The engines' latency histograms are pre-aggregated bucket counts read from the engines, which
the OpenTelemetry SDK's instruments (one measurement at a time) cannot carry: the request is
built here with the official protobuf classes (opentelemetry-proto) instead.

State across pushes: the delta temporality's last totals, and the PCIe byte counter
(hw.gpu.io) integrated from NVML's sampled throughput.
"""

from __future__ import annotations

import math

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gpuwatch import __version__
from gpuwatch.exporter.families.serving import rows
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.exposition.layout import BOUNDS, remap

CUMULATIVE = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = pb.AGGREGATION_TEMPORALITY_DELTA

# The semantic conventions' recommended boundaries (seconds), semantic-conventions-genai.
GEN_AI_BUCKETS = {
    "ttft": ("gen_ai.server.time_to_first_token",
             "Time to generate first token for successful responses.",
             (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
              7.5, 10.0)),
    "itl": ("gen_ai.server.time_per_output_token",
            "Time per output token generated after the first token for successful responses.",
            (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)),
    "e2e": ("gen_ai.server.request.duration",
            "Generative AI server request duration such as time-to-last byte or last output "
            "token.",
            (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
             81.92)),
}
HW_STATES = ("ok", "degraded", "failed", "predicted_failure")


def _text(v) -> str:
    """Valid UTF-8 whatever a process or pod calls itself (a name read from /proc may carry
    surrogate escapes, which protobuf refuses: one such name would lose every push)."""
    s = str(v)
    return s if s.isascii() else s.encode("utf-8", "replace").decode("utf-8")


def _kv(attrs: dict) -> list[KeyValue]:
    out = []
    for k, v in attrs.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            out.append(KeyValue(key=k, value=AnyValue(string_value=_text(v))))
        elif isinstance(v, int):
            out.append(KeyValue(key=k, value=AnyValue(int_value=v)))
        else:
            out.append(KeyValue(key=k, value=AnyValue(double_value=v)))
    return out


def _ns(t: float) -> int:
    return round(t * 1e9)


class Encoder:
    def __init__(self, host: str, node_name: str = "", delta: bool = False,
                 started: float = 0.0) -> None:
        self.host = host
        self.node_name = node_name
        self.delta = delta
        self.started = started
        self._last: dict[tuple, tuple[float, object]] = {}  # delta: (time, last total)
        self._io: dict[tuple[str, str], tuple[float, float, float]] = {}  # t, rate, total

    # -- one request -----------------------------------------------------------------------
    def encode(self, snap: Snapshot) -> bytes | None:
        if snap.tick is None:
            return None
        self._t = snap.tick.t
        self._start = snap.started or self.started or snap.tick.t
        host: dict[str, list] = {}
        owners: dict[tuple, dict[str, list]] = {}
        self._gpus(snap, host)
        self._processes(snap, host, owners)
        self._engines(snap, host)
        req = ExportMetricsServiceRequest()
        base = {"host.name": self.host, "service.name": "gpuwatch",
                "service.instance.id": self.host, "service.version": __version__}
        if self.node_name:
            base["k8s.node.name"] = self.node_name
        self._resource(req, base, host)
        for (ns, pod, container), metrics in sorted(owners.items()):
            attrs = dict(base)
            for key, value in (("k8s.namespace.name", ns), ("k8s.pod.name", pod),
                               ("k8s.container.name", container)):
                if value:
                    attrs[key] = value
            self._resource(req, attrs, metrics)
        return req.SerializeToString()

    @staticmethod
    def _resource(req, attrs: dict, metrics: dict[str, list]) -> None:
        if not metrics:
            return
        rm = req.resource_metrics.add(resource=Resource(attributes=_kv(attrs)))
        sm = rm.scope_metrics.add(scope=InstrumentationScope(name="gpuwatch",
                                                             version=__version__))
        for m in sorted(metrics.values(), key=lambda m: m[0].name):
            sm.metrics.append(m[0])

    # -- instruments -----------------------------------------------------------------------
    def _metric(self, out: dict, name: str, desc: str, unit: str, kind: str) -> pb.Metric:
        """kind: gauge | updown (non-monotonic cumulative sum) | counter | histogram."""
        entry = out.get(name)
        if entry is None:
            m = pb.Metric(name=name, description=desc, unit=unit)
            temporality = DELTA if self.delta and kind in ("counter", "histogram") \
                else CUMULATIVE
            if kind == "gauge":
                m.gauge.SetInParent()
            elif kind == "histogram":
                m.histogram.aggregation_temporality = temporality
            else:
                m.sum.aggregation_temporality = temporality
                m.sum.is_monotonic = kind == "counter"
            entry = out[name] = [m, kind]
        return entry[0]

    def _point(self, out: dict, name: str, desc: str, unit: str, kind: str, attrs: dict,
               value: float | None) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        m = self._metric(out, name, desc, unit, kind)
        points = m.gauge.data_points if kind == "gauge" else m.sum.data_points
        start = self._start
        if kind == "counter" and self.delta:
            start, value = self._delta((name, *sorted(attrs.items())), float(value))
        p = points.add(time_unix_nano=_ns(self._t), attributes=_kv(attrs))
        if kind != "gauge":
            p.start_time_unix_nano = _ns(start)
        p.as_double = float(value)

    def _delta(self, key: tuple, total):
        """The change since the last push, from then (a total that went back: a reset, its
        whole value since the process start)."""
        last = self._last.get(key)
        self._last[key] = (self._t, total)
        if last is None:
            return self._start, total
        t0, before = last
        if isinstance(total, float):
            return (t0, total - before) if total >= before else (self._start, total)
        if all(a >= b for a, b in zip(total, before, strict=True)):
            return t0, tuple(a - b for a, b in zip(total, before, strict=True))
        return self._start, total

    # -- GPUs ------------------------------------------------------------------------------
    def _gpus(self, snap: Snapshot, out: dict) -> None:
        derived = snap.derived
        driver = snap.extras.get("driver_version", "")
        for g in snap.tick.gpus:
            hw = {"hw.id": g.uuid, "hw.type": "gpu", "hw.name": f"gpu{g.index}",
                  "hw.model": g.name, "hw.vendor": "NVIDIA"}
            if driver:
                hw["hw.driver_version"] = driver
            p = self._point
            p(out, "hw.gpu.memory.usage", "GPU memory used.", "By", "updown", hw,
              g.memory_used_bytes)
            p(out, "hw.gpu.memory.limit", "Size of the GPU memory.", "By", "updown", hw,
              g.memory_total_bytes)
            if g.memory_used_bytes is not None and g.memory_total_bytes:
                p(out, "hw.gpu.memory.utilization", "Fraction of GPU memory used.", "1",
                  "gauge", hw, g.memory_used_bytes / g.memory_total_bytes)
            for task, value in (("general", g.utilization_ratio),
                                ("encoder", g.encoder_utilization_ratio),
                                ("decoder", g.decoder_utilization_ratio)):
                p(out, "hw.gpu.utilization", "Fraction of time spent in a specific task.",
                  "1", "gauge", {**hw, "hw.gpu.task": task}, value)
            for direction, rate in (("transmit", getattr(g, "pcie_tx_bytes_per_second", None)),
                                    ("receive", getattr(g, "pcie_rx_bytes_per_second", None))):
                p(out, "hw.gpu.io", "Received and transmitted bytes by the GPU (PCIe, "
                  "integrated from NVML's sampled throughput).", "By", "counter",
                  {**hw, "network.io.direction": direction}, self._io_total(g.uuid,
                                                                              direction, rate))
            for kind, total in (("corrected", g.ecc_volatile_corrected_total),
                                ("uncorrected", g.ecc_volatile_uncorrected_total)):
                p(out, "hw.errors", "Number of errors encountered by the component.",
                  "{error}", "counter", {**hw, "error.type": kind}, total)
            sig = derived.gpus.get(g.uuid)
            state = self._state(g, sig)
            for s in HW_STATES:
                p(out, "hw.status", "Operational status: 1 (true) or 0 (false) for each of "
                  "the possible states (predicted_failure: gpuwatch's time-to-OOM verdict).",
                  "1", "updown", {**hw, "hw.state": s}, 1.0 if s == state else 0.0)
            if sig is not None:
                self._gpu_signals(out, hw, sig)
            folded = derived.budget.folded.get(g.uuid)
            p(out, "gpuwatch.gpu.processes.folded", "Processes on the GPU without series of "
              "their own (the series budget).", "{process}", "updown", hw, folded)

    @staticmethod
    def _state(g, sig) -> str:
        if g.lost:
            return "failed"
        if sig is not None and (sig.time_to_oom_severity or 0) >= 1:
            return "predicted_failure"
        if getattr(g, "remapped_rows_failure", False) or getattr(g, "recovery_action", 0):
            return "degraded"
        return "ok"

    def _gpu_signals(self, out: dict, hw: dict, sig) -> None:
        p = self._point
        p(out, "gpuwatch.gpu.memory.leak_rate", "Robust trend of the memory the GPU keeps.",
          "By/s", "gauge", hw, sig.leak_rate_bytes_per_second)
        p(out, "gpuwatch.gpu.memory.leak_severity", "gpuwatch's leak verdict: 0 none, "
          "1 warning, 2 critical.", "{severity}", "gauge", hw, sig.leak_severity)
        p(out, "gpuwatch.gpu.time_to_oom", "Seconds until the memory budget is spent at the "
          "current leak rate (+Inf when not growing).", "s", "gauge", hw,
          sig.time_to_oom_seconds)
        p(out, "gpuwatch.gpu.time_to_oom_severity", "gpuwatch's time-to-OOM verdict: 0 none, "
          "1 warning, 2 critical.", "{severity}", "gauge", hw, sig.time_to_oom_severity)
        p(out, "gpuwatch.gpu.memory.zone", "Memory zone: 0 safe, 1 warning, 2 critical.",
          "{zone}", "gauge", hw, sig.zone)

    def _io_total(self, uuid: str, direction: str, rate: float | None) -> float | None:
        """Bytes since the daemon started, the sampled rate held until the next sample."""
        if rate is None:
            return None
        t = self._t
        last = self._io.get((uuid, direction))
        total = 0.0 if last is None else last[2] + last[1] * max(t - last[0], 0.0)
        self._io[(uuid, direction)] = (t, rate, total)
        return total

    # -- processes -------------------------------------------------------------------------
    def _processes(self, snap: Snapshot, host: dict, owners: dict) -> None:
        exported = snap.derived.budget.exported
        for g in snap.tick.gpus:
            for proc in g.processes:
                if exported is not None and (g.uuid, proc.pid) not in exported:
                    continue
                owner = (proc.namespace, proc.pod, proc.container)
                out = owners.setdefault(owner, {}) if any(owner) else host
                attrs = {"hw.id": g.uuid, "hw.type": "gpu", "process.pid": proc.pid,
                         "process.executable.name": proc.name}
                if proc.slurm_job_id:
                    attrs["gpuwatch.slurm_job_id"] = proc.slurm_job_id
                self._point(out, "gpuwatch.process.gpu.memory.usage", "GPU memory used by "
                            "the process (NVML).", "By", "updown", attrs,
                            proc.used_memory_bytes)
                sig = snap.derived.processes.get((g.uuid, proc.pid))
                if sig is None:
                    continue
                self._point(out, "gpuwatch.process.memory.leak_rate", "Robust trend of the "
                            "memory the process keeps.", "By/s", "gauge", attrs,
                            sig.leak_rate_bytes_per_second)
                self._point(out, "gpuwatch.process.memory.leak_severity", "gpuwatch's leak "
                            "verdict on the process: 0 none, 1 warning, 2 critical.", "{severity}",
                            "gauge", attrs, sig.leak_severity)

    # -- engines ---------------------------------------------------------------------------
    def _engines(self, snap: Snapshot, out: dict) -> None:
        for name, st in sorted(snap.derived.engines.items()):
            base = {"gpuwatch.engine": name, "gen_ai.provider.name": st.kind or "unknown"}
            self._point(out, "gpuwatch.engine.up", "1 while gpuwatch reads the engine's "
                        "metrics.", "", "gauge", {**base, "gen_ai.request.model": st.model},
                        1.0 if st.up else 0.0)
            if not st.up or st.ambiguous:  # as /metrics: no latencies from them
                continue
            for model, slis in rows(st):
                attrs = {**base, "gen_ai.request.model": model}
                for sli, (metric, desc, target) in GEN_AI_BUCKETS.items():
                    cumulative = slis.sli_buckets.get(sli)
                    total = slis.sli_seconds_total.get(sli)
                    if not cumulative or total is None:
                        continue
                    self._histogram(out, metric, desc, attrs, cumulative, total, target)

    def _histogram(self, out: dict, name: str, desc: str, attrs: dict,
                   cumulative: list[float], total: float, target: tuple[float, ...]) -> None:
        """gpuwatch's buckets (layout.BOUNDS, then +Inf) on the conventions' boundaries:
        exact where those are layout bounds (time to first token, time per output token),
        read off the layout's piecewise-linear distribution elsewhere (request duration)."""
        # whole requests, cumulative (so the buckets add up to the count, and deltas to the
        # totals), before the change since the last push
        mapped = [float(round(v)) for v in remap((*BOUNDS, math.inf), list(cumulative),
                                                 to=target)]
        start = self._start
        key = (name, *sorted(attrs.items()))
        values = (*mapped, float(total))
        if self.delta:
            start, values = self._delta(key, values)
        *cum, s = values
        m = self._metric(out, name, desc, "s", "histogram")
        counts = [int(b - a) for a, b in zip([0.0, *cum[:-1]], cum, strict=True)]
        m.histogram.data_points.add(
            attributes=_kv(attrs), start_time_unix_nano=_ns(start),
            time_unix_nano=_ns(self._t), count=int(cum[-1]), sum=max(s, 0.0),
            bucket_counts=counts, explicit_bounds=list(target))
