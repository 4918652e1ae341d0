"""HealthEvents to NVSentinel's platform connector over its node-local gRPC Unix socket.

Each tick's findings (verdict.py) are compared with what was last delivered, per GPU and
check: a new critical code is one unhealthy event (fatal when the GPU or node needs a node
tool: the XID table's action, uncorrectable ECC, row remapping, a lost GPU), a cleared one a
healthy event; the first pass after a start sends a healthy baseline for GPUs without
findings, which clears what a previous run left. Warnings (application XIDs, warning levels)
are one non-fatal event when they appear. Memory pressure is never fatal: the node is sound,
a process is leaking; its action is to restart that application.

Delivery runs on a thread of its own with a timeout; what fails stays queued (bounded) and
is retried on the next tick. grpcio is imported there, only when [nvsentinel] is enabled.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import stat
import time

from gpuwatch.exporter.snapshot import SourceStatus
from gpuwatch.nodehealth.verdict import Finding, gpu_findings

log = logging.getLogger("gpuwatch")

AGENT = "gpuwatch"
COMPONENT = "GPU"
MAX_PENDING = 256
HEALTH_FIELDS = ("index", "uuid", "pci_bus_id", "lost", "xid_events_total", "xid_last_seen",
                 "ecc_volatile_uncorrected_total", "remapped_rows_failure",
                 "remapped_rows_pending")
SIGNAL_FIELDS = ("time_to_oom_seconds", "time_to_oom_severity", "zone", "threshold_row")
# gpuwatch's action classes as NVSentinel's RecommendedAction names ("reboot" per config)
ACTIONS = {"reset_gpu": "COMPONENT_RESET", "contact_support": "CONTACT_SUPPORT",
           "restart_app": "CUSTOM", "investigate": "UNKNOWN"}


def health_view(gpu, signals) -> tuple[dict, dict]:
    """The fields verdict.py reads, as plain values (cheap: no process lists)."""
    g = {k: getattr(gpu, k, None) for k in HEALTH_FIELDS}
    s = {k: getattr(signals, k, None) for k in SIGNAL_FIELDS} if signals is not None else {}
    return g, s


class Publisher:
    def __init__(self, cfg, status: SourceStatus, node_name: str) -> None:
        self.cfg = cfg
        self.status = status
        self.node = cfg.node_name or node_name
        # (check, uuid) -> critical codes delivered; absent: nothing delivered yet
        self.delivered: dict[tuple[str, str], frozenset[str]] = {}
        self.warned: set[tuple[str, str]] = set()  # (uuid, code) of warnings delivered
        self.pending: list[dict] = []
        self.dropped = 0
        self._future: concurrent.futures.Future | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "gpuwatch-nvsentinel")

    # -- what to say (pure, on the loop: a few dict operations per GPU) -------------------
    def update(self, gpus, signals: dict, now: float) -> None:
        since = now - 3600.0  # a warning XID counts while it is recent
        for gpu in gpus:
            if getattr(gpu, "mig_parent_uuid", ""):
                continue  # a MIG instance's health is its parent GPU's
            g, s = health_view(gpu, signals.get(gpu.uuid))
            found = gpu_findings(g, s, warnings_since=since)
            for check in ("GpuwatchGpuUnhealthy", "GpuwatchGpuMemoryPressure"):
                crit = {f.code: f for f in found if f.condition == check
                        and f.severity == "critical"}
                key = (check, gpu.uuid)
                before = self.delivered.get(key)
                if before is None and not crit:
                    self._queue(self._healthy(check, g, (), now))
                for code in sorted(set(crit) - (before or frozenset())):
                    self._queue(self._event(crit[code], now))
                for code in sorted((before or frozenset()) - set(crit)):
                    self._queue(self._healthy(check, g, (code,), now))
                self.delivered[key] = frozenset(crit)
            warnings = {(f.uuid, f.code): f for f in found if f.severity == "warning"}
            for key in sorted(set(warnings) - self.warned):
                self._queue(self._event(warnings[key], now))
            self.warned = {k for k in self.warned if k[0] != gpu.uuid} | set(warnings)
        self._send_due()

    def _entities(self, g: dict) -> list[dict]:
        out = [{"entityType": COMPONENT, "entityValue": str(g.get("index"))}]
        if g.get("pci_bus_id"):
            out.append({"entityType": "PCI", "entityValue": str(g["pci_bus_id"])})
        out.append({"entityType": "GPU_UUID", "entityValue": str(g.get("uuid") or "")})
        return out

    def _base(self, check: str, g: dict, now: float) -> dict:
        return {"version": 1, "agent": AGENT, "componentClass": COMPONENT, "checkName": check,
                "nodeName": self.node, "generatedTimestamp": now,
                "entitiesImpacted": self._entities(g),
                "processingStrategy": self.cfg.processing_strategy}

    def _event(self, f: Finding, now: float) -> dict:
        g = {"index": f.gpu, "uuid": f.uuid, "pci_bus_id": f.pci_bus_id}
        action = (self.cfg.reboot_action if f.action == "reboot_node"
                  else ACTIONS.get(f.action, "UNKNOWN"))
        ev = {**self._base(f.condition, g, now), "isFatal": f.fatal, "isHealthy": False,
              "message": f.message, "errorCode": [f.code], "recommendedAction": action,
              "metadata": {"gpuwatch_action": f.action, "gpuwatch_severity": f.severity}}
        if action == "CUSTOM":
            ev["customRecommendedAction"] = f.action.upper()
        return ev

    def _healthy(self, check: str, g: dict, codes: tuple[str, ...], now: float) -> dict:
        what = f"{', '.join(codes)} cleared" if codes else "no problem found"
        return {**self._base(check, g, now), "isFatal": False, "isHealthy": True,
                "message": f"GPU {g.get('index')} ({g.get('uuid')}): {what}",
                "errorCode": list(codes), "recommendedAction": "NONE"}

    def _queue(self, event: dict) -> None:
        self.pending.append(event)
        if len(self.pending) > MAX_PENDING:  # oldest first: the latest state matters most
            del self.pending[0]
            self.dropped += 1

    # -- delivery (on the executor) ---------------------------------------------------------
    def _send_due(self) -> None:
        """On the loop: take the finished delivery's outcome, then start the next one."""
        if self._future is not None:
            if not self._future.done():
                return
            self._sent(*self._future.result())
            self._future = None
        if self.pending:
            self._future = self._pool.submit(self._deliver, list(self.pending))

    def _deliver(self, batch: list[dict]) -> tuple[list[dict], str]:
        try:
            return batch, self._send(batch)
        except Exception as exc:  # delivery never costs a tick
            log.exception("nvsentinel delivery failed")
            return batch, f"delivery failed: {exc!r}"

    def _sent(self, batch: list[dict], problem: str) -> None:
        if problem:
            self.status.up, self.status.reason = False, str(problem)
            self.status.errors_total += 1
            return
        sent = {id(e) for e in batch}
        self.pending = [e for e in self.pending if id(e) not in sent]
        self.status.up, self.status.reason = True, ""
        self.status.last_success = time.time()

    def _send(self, batch: list[dict]) -> str:
        """'' when delivered, else why not."""
        path = self.cfg.socket
        try:
            if not stat.S_ISSOCK(os.stat(path).st_mode):
                return f"{path} is not a unix socket"
        except OSError as exc:
            return f"no platform-connector socket at {path} ({exc.strerror})"
        try:
            import grpc

            from gpuwatch.nodehealth.nvsentinel_api import health_event_pb2 as pb
            from gpuwatch.nodehealth.nvsentinel_api import health_event_pb2_grpc as pb_grpc
        except ImportError as exc:
            return f"grpcio is not installed ({exc.name}): install gpuwatch's 'kubernetes' extra"
        t0 = time.perf_counter()
        request = pb.HealthEvents(version=1, events=[to_message(pb, e) for e in batch])
        try:
            with grpc.insecure_channel(f"unix://{os.path.abspath(path)}",
                                       options=[("grpc.enable_http_proxy", 0)]) as channel:
                pb_grpc.PlatformConnectorStub(channel).HealthEventOccurredV1(
                    request, timeout=self.cfg.timeout_seconds)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            return f"HealthEventOccurredV1 failed: {getattr(code, 'name', code)}"
        self.status.last_duration_seconds = time.perf_counter() - t0
        log.info("nvsentinel: delivered %d health event(s)", len(batch))
        return ""

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def to_message(pb, e: dict):
    from google.protobuf.timestamp_pb2 import Timestamp

    ts = Timestamp()
    ts.FromNanoseconds(int(e["generatedTimestamp"] * 1e9))
    fields = {k: v for k, v in e.items() if k not in ("generatedTimestamp", "entitiesImpacted",
                                                      "recommendedAction",
                                                      "processingStrategy")}
    return pb.HealthEvent(
        **fields, generatedTimestamp=ts,
        entitiesImpacted=[pb.Entity(**x) for x in e["entitiesImpacted"]],
        recommendedAction=pb.RecommendedAction.Value(e["recommendedAction"]),
        processingStrategy=pb.ProcessingStrategy.Value(e["processingStrategy"]))


def make_publisher(cfg, sources: dict[str, SourceStatus], host: str) -> Publisher | None:
    if not cfg.nvsentinel.enabled:
        return None
    status = sources.setdefault("nvsentinel", SourceStatus())
    status.reason = status.reason or "nothing delivered yet"
    return Publisher(cfg.nvsentinel, status, host)
