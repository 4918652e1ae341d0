"""Fault campaign against a real daemon on loopback: webhook floods, a full disk, SIGHUP
storms, SIGKILL while recording. Each fault is bounded in count and time, and each test
asserts liveness, bounded memory and latency, and what is kept.

(Abusive engine endpoints are in test_fault_engines.py.)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import resource
import signal
import statistics
import subprocess
import time
import urllib.request

import psutil
import pytest

from gpuwatch.recording import GZIP_FLUSH_SECONDS, read_recording
from tests.helpers import http_get, wait_until
from tests.test_remediation_webhook import alert, payload

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "fault-campaign-token-0123456789"
# Bounds for a shared 2-core machine: generous, but far below what a stall or a leak gives.
RSS_GROWTH_MB = 40
LATENCY_P99_S = 0.5
FLOOD_P99_S = 1.0


def rss_mb(d) -> float:
    return psutil.Process(d.proc.pid).memory_info().rss / 2**20


def scrape_latencies(d, n: int, pause: float = 0.02) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        status, _ = http_get(d.url + "/metrics", 5.0)
        out.append(time.perf_counter() - t0)
        assert status == 200
        time.sleep(pause)
    return out


def p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) > 1 else xs[0]


def post_alerts(d, alerts: list[dict], token: str = TOKEN) -> int:
    req = urllib.request.Request(
        d.url + "/alertmanager", data=json.dumps(payload(*alerts)).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def gpu_alerts(d, prefix: str, n: int) -> list[dict]:
    """GPU-level alerts (a read-only NVML snapshot each) with distinct fingerprints."""
    uuid = d.state()["sample"]["gpus"][0]["uuid"]
    out = []
    for i in range(n):
        a = alert(fingerprint=f"{prefix}{i}", uuid=uuid, name="GpuwatchGpuMemoryCritical")
        del a["labels"]["pid"], a["labels"]["process"]
        out.append(a)
    return out


WEBHOOK_TOML = f"""
[remediation]
cooldown_seconds = 0
rate_limit = 100000
max_concurrent = 64
[webhook]
token = "{TOKEN}"
"""


def action_lines(path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines()]  # every line whole JSON


# -- full disk --------------------------------------------------------------------------

@contextlib.contextmanager
def small_disk(where):
    where.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here ({exc}); "
                    "test_full_disk_rlimit covers the no-crash part")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory) -> object:
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:  # down to the last byte: a short write ends in ENOSPC too
            f.write(b"\0" * 512)
    return filler


def test_full_disk_events_log_resumes_and_keeps_the_gap(daemon, tmp_path):
    with small_disk(tmp_path / "disk") as disk:
        events = disk / "events.jsonl"
        d = daemon("--simulate", "steady", "--events-log", str(events),
                   config_toml=WEBHOOK_TOML)
        assert post_alerts(d, gpu_alerts(d, "before", 3)) == 200
        wait_until(lambda: len(action_lines(events)) >= 3, 15, what="3 actions logged")

        filler = fill(disk)
        assert post_alerts(d, gpu_alerts(d, "gap", 5)) == 200
        wait_until(lambda: "write failed" in d.output(), 15, what="the failure logged")
        rss0 = rss_mb(d)
        assert p99(scrape_latencies(d, 30)) < LATENCY_P99_S
        assert d.alive()

        filler.unlink()
        wait_until(lambda: "resumed after a gap" in d.output(), 15, what="resume logged")
        lines = action_lines(events)
        fps = sorted(x["detail"]["fingerprint"] for x in lines if "action" in x)
        assert fps == sorted([f"before{i}" for i in range(3)] + [f"gap{i}" for i in range(5)])
        assert "0 dropped" in d.output()
        # And the log goes on after the gap.
        assert post_alerts(d, gpu_alerts(d, "after", 2)) == 200
        wait_until(lambda: len(action_lines(events)) >= 10, 15, what="actions after the gap")
        assert rss_mb(d) - rss0 < RSS_GROWTH_MB


def test_full_disk_rlimit_keeps_the_daemon_alive(daemon, tmp_path):
    """Where no tmpfs can be mounted: a file-size limit makes every write past it fail."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    events = tmp_path / "events.jsonl"
    events.write_bytes(b"#" * (64 * 1024 - 10) + b"\n")  # room for nothing more
    d = daemon("--simulate", "steady", "--events-log", str(events), config_toml=WEBHOOK_TOML,
               preexec=limit)
    assert post_alerts(d, gpu_alerts(d, "f", 5)) == 200
    wait_until(lambda: "write failed" in d.output(), 15, what="the failure logged")
    assert p99(scrape_latencies(d, 20)) < LATENCY_P99_S
    assert d.alive()


# -- webhook flood ----------------------------------------------------------------------

def test_webhook_flood(daemon):
    d = daemon("--simulate", "mixed", config_toml=WEBHOOK_TOML.replace(
        "cooldown_seconds = 0", "cooldown_seconds = 600"))
    scrape_latencies(d, 5)
    rss0 = rss_mb(d)
    base = gpu_alerts(d, "x", 1)[0]

    def one(i: int) -> int:
        if i % 4 == 0:
            return post_alerts(d, [base], token="wrong")  # refused before any work
        batch = []
        for j in range(10):
            a = json.loads(json.dumps(base))
            a["fingerprint"] = f"flood-{i}-{j}"
            batch.append(a)
        return post_alerts(d, batch)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        flood = pool.map(one, range(120))
        lat = scrape_latencies(d, 100)
        statuses = list(flood)
    assert statuses.count(401) == 30 and statuses.count(200) == 90
    assert p99(lat) < FLOOD_P99_S, sorted(lat)[-5:]
    assert d.alive() and rss_mb(d) - rss0 < RSS_GROWTH_MB
    # One snapshot per target, then cooldown: a flood runs nothing more than one alert does.
    ran = skipped = 0.0
    for line in d.metrics().splitlines():
        if line.startswith('gpuwatch_remediation_actions_total{action="snapshot"'):
            value = float(line.rsplit(" ", 1)[1])
            if 'result="skipped_' in line:
                skipped += value
            else:
                ran += value
    assert ran == 1 and skipped == 90 * 10 - 1


# -- SIGHUP storm -----------------------------------------------------------------------

def test_sighup_storm(daemon, tmp_path):
    d = daemon("--simulate", "mixed", config_toml="[nvml]\nslow_interval_seconds = 30\n")
    cfg = next(tmp_path.glob("gpuwatch-*.toml"))
    scrape_latencies(d, 5)
    rss0 = rss_mb(d)
    lat = []
    for i in range(200):
        good = i % 3 != 1
        cfg.write_text(f"[nvml]\nslow_interval_seconds = {100 + i}\n" if good
                       else "[nvml]\nslow_interval_seconds = 'x'\n")
        d.proc.send_signal(signal.SIGHUP)
        if i % 10 == 0:
            lat += scrape_latencies(d, 2, pause=0)
    cfg.write_text("[nvml]\nslow_interval_seconds = 77\n")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: d.state()["config"]["nvml"]["slow_interval_seconds"] == 77, 20,
               what="the last file applied")
    out = d.output()
    # Coalesced: far fewer reloads than signals, and never a half-applied one.
    assert out.count("configuration reload") < 200
    assert "Traceback" not in out
    assert p99(lat) < LATENCY_P99_S
    assert d.alive() and rss_mb(d) - rss0 < RSS_GROWTH_MB


# -- SIGKILL while recording -------------------------------------------------------------

@pytest.mark.parametrize("name", ["rec.jsonl", "rec.jsonl.gz"])
def test_sigkill_while_recording_loses_at_most_a_few_seconds(daemon, tmp_path, name):
    path = tmp_path / name
    d = daemon("--simulate", "mixed", "--record", str(path),
               config_toml="[nvml]\nfast_interval_seconds = 0.5\n")
    wait_until(lambda: d.state()["t"] and d.state()["t"] > d.state()["started"] + 12, 30,
               what="12 s of ticks")
    last_served = d.state()["t"]
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    kept = [t.t for t in read_recording(str(path))[1]]
    assert kept, "nothing kept"
    lost = last_served - kept[-1]
    assert lost <= (GZIP_FLUSH_SECONDS + 0.5 if name.endswith(".gz") else 0.5), lost
    # Ticks are whole and in order up to the kill.
    assert kept == sorted(kept) and len(kept) >= 12 / 0.5 - 2 - GZIP_FLUSH_SECONDS / 0.5


# -- hostile local users, all at once (each attack alone: tests/test_hostile_*.py) ----------

def test_hostile_local_users_at_once(daemon, tmp_path):
    """One daemon that records, scraped throughout, against: processes of another uid named
    with bytes that are not UTF-8 and terminal controls, one in a kubepods-shaped cgroup of
    its own, a user filling all it may write of the probe filesystem, and a flood of large
    snapshots of that user's process beside two other users' snapshots."""
    from tests import hostile_users as hu

    if not hu.ROOT:
        pytest.skip("needs root to mount and to run processes of other uids")
    filler_uid, mib = 4244, 1 << 20
    procs, shared = hu.Procs(), hu.shared_dir()
    cg = hu.Cgroups(hu.cgroup2_root()) if hu.cgroup2_root() else None
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "tmpfs", shared],
                       check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        hu.remove_shared(shared)
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        base = f"{shared}/probe"
        named = [procs.renamed(hu.BAD_COMM, hu.ATTACKER).pid,
                 procs.binary_named(hu.BAD_FILE, hu.ATTACKER).pid]
        flooder = procs.script(hu.SNAP_PROBE, base, "dense", str(3 * mib), uid=hu.ATTACKER).pid
        victims = [procs.script(hu.SNAP_PROBE, base, "dense", str(mib), uid=u).pid
                   for u in (hu.VICTIM, 5001)]
        filler = procs.script(hu.FILL, base, uid=filler_uid)
        spoof = []
        if cg is not None:
            mgr = f"user.slice/user-{hu.ATTACKER}.slice/user@{hu.ATTACKER}.service"
            cg.make(mgr, owner=hu.ATTACKER)
            p = procs.script(hu.SELF_MOVE, uid=hu.ATTACKER, stdin=subprocess.PIPE)
            cg.move(p.pid, mgr)
            p.stdin.write(cg.path(f"{mgr}/kubepods.slice/kubepods-pod55c6c714_b240_4dec_9a45_"
                                  "57b61696ab6e.slice/cri-containerd-" + "e" * 64 + ".scope")
                          + "\n")
            p.stdin.flush()
            assert p.stdout.readline().strip() == "moved"
            spoof.append(p.pid)
        pids = [*named, flooder, *victims, filler.pid, *spoof]
        (tmp_path / "gpu-pids").write_text("".join(f"{p}\n" for p in pids))
        rec = tmp_path / "rec.jsonl"
        d = daemon("--record", str(rec), module="tests.fake_nvml_daemon",
                   env={"FAKE_NVML_PIDS_FILE": str(tmp_path / "gpu-pids")},
                   config_toml=WEBHOOK_TOML + f"""
[probe]
dir = "{base}"
user_max_bytes = {8 * mib}
user_max_files = 256
[remediation.snapshot]
dir = "{tmp_path / 'snaps'}"
max_total_bytes = {16 * mib}
max_user_bytes = {6 * mib}
max_snapshot_bytes = {4 * mib}
""")
        assert filler.stdout.readline().startswith("full ")
        wait_until(lambda: {p["pid"] for p in d.state()["sample"].get("probes", ())}
                   >= {flooder, *victims}, 30, what="the probes read")
        uuid = d.state()["sample"]["gpus"][0]["uuid"]
        assert post_alerts(d, [alert(pid=p, uuid=uuid, fingerprint=f"v{p}")
                               for p in victims]) == 200
        snaps = tmp_path / "snaps"
        wait_until(lambda: len(list(snaps.glob("*-allocator.pickle"))) == 2, 30,
                   what="the victims' snapshots")
        kept = sorted(snaps.glob("*-allocator.pickle"))
        rss0 = rss_mb(d)

        def flood(i: int) -> int:
            return post_alerts(d, [alert(pid=flooder, uuid=uuid, fingerprint=f"f{i}-{j}")
                                   for j in range(5)])
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            statuses = pool.map(flood, range(8))
            lat = scrape_latencies(d, 150)
            state_codes = [http_get(d.url + "/api/state", 10)[0] for _ in range(20)]
            assert list(statuses) == [200] * 8
        assert state_codes == [200] * 20 and p99(lat) < FLOOD_P99_S, sorted(lat)[-5:]
        assert d.get("/readyz") == (200, b"ready\n")
        assert "gpuwatch_tick_failures_total 0.0" in d.metrics()
        assert d.alive() and rss_mb(d) - rss0 < RSS_GROWTH_MB
        # the victims' snapshots survived the flood, the directory kept its cap
        assert all(p.exists() for p in kept)
        assert sum(f.stat().st_size for f in snaps.iterdir()) <= 16 * mib + 4 * mib
        # the victims' probes still publish: their records are fresh
        now = d.state()["t"]
        fresh = {p["pid"] for p in d.state()["sample"]["probes"] if now - p["t"] < 10}
        assert set(victims) <= fresh
        # the spoofer got no pod; every tick was recorded with the named processes
        labels = [line for line in d.metrics().splitlines()
                  if line.startswith("gpuwatch_process_gpu_memory_used_bytes{")]
        assert all('pod=""' in line for line in labels)
        d.stop()
        out = d.log_path.read_bytes()
        assert b"Traceback" not in out and b"\x1b" not in out and b"\r" not in out
        ticks = list(read_recording(str(rec))[1])
        assert ticks and all({*named} <= {p.pid for p in t.gpus[0].processes}
                             for t in ticks[2:])
    finally:
        procs.close()
        if cg is not None:
            cg.close()
        hu.remove_shared(shared)
