"""What remediation costs the daemon: the per-tick call when nothing fires (the hot path),
a burst of decisions (each audited with an fsync), one audit record, and one Alertmanager
notification through the webhook on loopback.

    python -m benchmarks.remediation_overhead [--json FILE]

Runs on the simulated `large` host (8 GPUs x 64 processes), in dry-run mode so nothing is
performed; the audit log and snapshots go to a temporary directory on the current disk.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time

import aiohttp
from aiohttp import web

from benchmarks.report import emit
from gpuwatch.events import Event
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.model import Tick
from gpuwatch.remediation.audit import AuditLog
from gpuwatch.remediation.config import (
    AuditConfig,
    RemediationConfig,
    SnapshotConfig,
    WebhookConfig,
)
from gpuwatch.remediation.remediator import Remediator
from gpuwatch.sources.simulate import SimulatedBackend


def _quantiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"median_us": statistics.median(s) * 1e6, "p99_us": s[int(0.99 * (len(s) - 1))] * 1e6,
            "n": len(s)}


def _remediator(tmp: str, dry_run: bool, token: str = "") -> Remediator:
    cfg = RemediationConfig(cooldown_seconds=0, rate_limit=10**9, max_concurrent=10**6,
                            snapshot=SnapshotConfig(dir=os.path.join(tmp, "snaps")),
                            audit=AuditConfig(path=os.path.join(tmp, "audit.jsonl"),
                                              max_bytes=1 << 30))
    return Remediator(cfg, WebhookConfig(token=token), probe_dir="", dry_run=dry_run)


async def _idle_tick(tmp: str, snap: Snapshot, n: int) -> dict:
    rem = _remediator(tmp, dry_run=True)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await rem.on_events([], snap)
        times.append(time.perf_counter() - t0)
    await rem.close()
    return _quantiles(times)


async def _burst(tmp: str, snap: Snapshot, events: list[Event]) -> dict:
    rem = _remediator(tmp, dry_run=True)
    t0 = time.perf_counter()
    out = await rem.on_events(events, snap)
    took = time.perf_counter() - t0
    await rem.close()
    return {"events": len(events), "decisions": len(out), "total_ms": took * 1e3,
            "per_decision_us": took / max(1, len(out)) * 1e6}


def _audit(tmp: str, n: int) -> dict:
    log = AuditLog(os.path.join(tmp, "bench-audit.jsonl"), max_bytes=1 << 30)
    rec = {"t": time.time(), "action": "snapshot", "target": "GPU-x/pid:1", "result": "ok",
           "trigger": "policy", "detail": {"signal": "memory_leak", "pad": "x" * 200}}
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        log.write(rec)
        times.append(time.perf_counter() - t0)
    log.close()
    return _quantiles(times)


async def _webhook(tmp: str, snap: Snapshot, n: int) -> dict:
    rem = _remediator(tmp, dry_run=True, token="bench-token")
    await rem.on_events([], snap)
    app = web.Application()
    app.add_routes(rem.routes())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/alertmanager"
    gpu = snap.tick.gpus[0]
    times = []
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            body = {"version": "4", "status": "firing", "receiver": "r", "alerts": [{
                "status": "firing", "fingerprint": f"{i:016x}", "startsAt": "2026-01-01T00:00:00Z",
                "labels": {"alertname": "GpuwatchProcessMemoryLeak", "severity": "critical",
                           "uuid": gpu.uuid, "pid": str(gpu.processes[i % 64].pid)}}]}
            t0 = time.perf_counter()
            async with session.post(url, json=body,
                                    headers={"Authorization": "Bearer bench-token"}) as r:
                await r.read()
                assert r.status == 200, r.status
            times.append(time.perf_counter() - t0)
    await runner.cleanup()
    await rem.close()
    return _quantiles(times)


async def main(args) -> dict:
    backend = SimulatedBackend("large", interval=2.0)
    now = time.time()
    backend.sample(now - 600)  # start of the scenario: processes are up and steady
    gpus = backend.sample(now)
    snap = Snapshot(tick=Tick(t=now, gpus=gpus))
    events = [Event(t=now, signal="memory_leak", state="firing", severity="critical",
                    gpu_uuid=g.uuid, pid=p.pid) for g in gpus for p in g.processes[:8]]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        return {
            "host": {"python": platform.python_version(), "machine": platform.machine(),
                     "cpu": platform.processor() or platform.machine(),
                     "cpus": os.cpu_count(), "disk_dir": args.dir or tempfile.gettempdir()},
            "gpus": len(gpus), "processes": sum(len(g.processes) for g in gpus),
            "idle_tick": await _idle_tick(tmp, snap, args.ticks),
            "burst_dry_run": await _burst(tmp, snap, events),
            "audit_write_fsync": _audit(tmp, args.records),
            "webhook_post": await _webhook(tmp, snap, args.posts),
        }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--records", type=int, default=500)
    ap.add_argument("--posts", type=int, default=300)
    ap.add_argument("--dir", default=None, help="where the audit log goes (its disk is timed)")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    result = asyncio.run(main(args))
    emit(result, args.json)
