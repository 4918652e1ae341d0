"""A legitimate scraper next to hostile clients, for the code as it is and as it was.

    python -m benchmarks.hostile_clients [--before DIR] [--seconds 60] [--flood-seconds 150]
                                         [--only SCENARIO...] [--json FILE]

Each run starts a fresh `gpuwatch run --simulate steady` with TLS and basic auth (bcrypt cost
12), one engine to scrape (a vLLM exposition on loopback) and the descriptor limit a service
manager leaves by default (soft 1024), then attacks it from tests/hostile_clients.py:

- idle-1024: 1024 half-sent requests after the TLS handshake, re-opened when closed, from one
  host (127.0.0.2) and from 16 (127.0.0.2-17);
- flood-512: 512 concurrent requests with distinct wrong credentials, from one host and 16.

The scraper (127.0.0.1) GETs /metrics with the right credentials on a new TLS connection
every 0.5 s, timeout 10 s (Prometheus's default), as long as the attack lasts: --seconds, and
--flood-seconds for the floods, long enough for the wrong credentials to outnumber the 256
verdicts the code before kept (bcrypt at cost 12 checks only a few a second on 2 vCPUs).
Reported: its latency (failures at the time they took), RSS, log bytes per minute, the
engine's scrape errors, and how long the daemon takes to exit on SIGTERM with the attack on.
--before DIR runs the same against another checkout (the code before, in a worktree).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bcrypt
import psutil
import yaml

from benchmarks.report import emit
from tests.helpers import REPO, StaticServer, free_port
from tests.hostile_clients import Attack, Scraper
from tests.tls_certs import CA

USER, PASSWORD = "prometheus", "bench-pass-4f1a"
HOSTS16 = ",".join(f"127.0.0.{i}" for i in range(2, 18))
SCENARIOS = {
    "baseline": None,
    "idle-1024-one-host": ("idle", 1024, "127.0.0.2"),
    "idle-1024-16-hosts": ("idle", 1024, HOSTS16),
    "flood-512-one-host": ("flood", 512, "127.0.0.2"),
    "flood-512-16-hosts": ("flood", 512, HOSTS16),
}


def _limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


def _sample(body: bytes, prefix: str) -> float | None:
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


def run_one(repo: Path, work: Path, scenario, seconds: float, web: Path, ca: str,
            engine_url: str, label: str = "", keep_logs: Path | None = None) -> dict:
    port = free_port()
    cfg = work / f"gpuwatch-{port}.toml"
    cfg.write_text(f'[[engines]]\nname = "vllm"\nurl = "{engine_url}"\ninterval_seconds = 2\n')
    log = work / f"gpuwatch-{port}.log"
    env = {**os.environ, "PYTHONPATH": str(repo), "STATE_DIRECTORY": str(work / f"s{port}")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch", "run", "--simulate", "steady", "--listen",
             f"127.0.0.1:{port}", "--config", str(cfg), "--web-config", str(web)],
            stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_limit, cwd=work)
    me = psutil.Process(proc.pid)
    scraper = Scraper(f"127.0.0.1:{port}", USER, PASSWORD, ca)
    deadline = time.monotonic() + 60
    while scraper.get()[0] != 200:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"daemon did not come up: {log.read_text()[-2000:]}")
        time.sleep(0.5)
    time.sleep(3)  # the engine's first scrapes
    errors_key = 'gpuwatch_collect_errors_total{source="engine:vllm"}'
    engine_errors0 = _sample(scraper.get()[2], errors_key) or 0
    rss0 = me.memory_info().rss
    attack = Attack(scenario[0], f"127.0.0.1:{port}", scenario[1], sources=scenario[2]) \
        if scenario else None
    time.sleep(5 if attack else 0)
    log0, t0 = log.stat().st_size, time.monotonic()
    lat, outcome, rss, last_body = [], {}, [], b""
    while time.monotonic() - t0 < seconds:
        status, dt, body = scraper.get()
        lat.append(dt)
        outcome[str(status)] = outcome.get(str(status), 0) + 1
        if status == 200:
            last_body = body
        try:
            rss.append(me.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(max(0.0, 0.5 - dt))
    elapsed = time.monotonic() - t0
    log_bytes = log.stat().st_size - log0
    engine_errors = _sample(last_body, errors_key)
    t_stop = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
        stop_s: float | str = round(time.monotonic() - t_stop, 2)
    except subprocess.TimeoutExpired:
        for p in [*me.children(recursive=True), me]:  # its engine readers too
            p.kill()
        proc.wait()
        stop_s = "> 30 (killed)"
    seen = attack.stop(timeout=120) if attack else {}
    text = log.read_text(errors="replace")
    if keep_logs:
        keep_logs.mkdir(parents=True, exist_ok=True)
        (keep_logs / f"{label}.log").write_text(text)
    lat.sort()
    return {
        "scrapes": len(lat), "outcome": outcome,
        "p50_s": round(statistics.median(lat), 3),
        "p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 3),
        "max_s": round(lat[-1], 3),
        "rss_mb_before": round(rss0 / 2**20, 1),
        "rss_mb_max": round(max(rss, default=rss0) / 2**20, 1),
        "log_bytes_per_minute": round(log_bytes / elapsed * 60),
        "tracebacks": text.count("Traceback"),
        "first_traceback": text[text.find("Traceback"):][:3000] if "Traceback" in text else "",
        "accept_out_of_resource_lines": text.count("out of system resource"),
        "engine_scrape_errors": None if engine_errors is None
        else engine_errors - engine_errors0,
        "stop_seconds_under_attack": stop_s,
        "load_average_1m": round(os.getloadavg()[0], 1),  # a shared machine: how shared
        "exit_status": proc.returncode,
        "attacker": seen,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, help="another checkout to measure the same way")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--flood-seconds", type=float, default=150)
    ap.add_argument("--only", nargs="*", choices=list(SCENARIOS), default=list(SCENARIOS))
    ap.add_argument("--json")
    ap.add_argument("--keep-logs", type=Path, help="copy each daemon's log here")
    args = ap.parse_args()
    builds = {"after": REPO, **({"before": args.before.resolve()} if args.before else {})}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ca = CA(work, "ca")
        ca.issue("server", server=True)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=12)).decode()
        web = work / "web.yml"
        web.write_text(yaml.safe_dump({
            "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
            "basic_auth_users": {USER: hashed}}))
        engine = StaticServer(
            (REPO / "tests/fixtures/engines/vllm-0.32.0-cpu-real-load.prom").read_bytes())
        results: dict = {}
        try:
            for name in args.only:
                for build, repo in builds.items():
                    print(f"{name} / {build} ...", file=sys.stderr, flush=True)
                    seconds = args.flood_seconds if name.startswith("flood") else args.seconds
                    results.setdefault(name, {})[build] = run_one(
                        repo, work, SCENARIOS[name], seconds, web, str(ca.crt),
                        engine.url + "/metrics", f"{name}-{build}", args.keep_logs)
        finally:
            engine.close()
    emit({"machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} vCPU, Python "
                     f"{platform.python_version()}",
          "seconds_per_run": args.seconds, "seconds_per_flood": args.flood_seconds,
          "scrape_timeout_s": 10, "bcrypt_cost": 12,
          "nofile_soft": 1024, "results": results}, args.json)


if __name__ == "__main__":
    main()
