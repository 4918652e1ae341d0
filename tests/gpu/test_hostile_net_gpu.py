"""Under 1024 idle TLS connections from 16 addresses, on a real GPU (skipped without one): the
daemon (real NVML, descriptor limit soft 1024) keeps reading a real PyTorch process's probe,
answers its legitimate scraper, writes the probe's allocator snapshot asked through the
webhook, and stops within its deadline with the attack still on. About 60 s.

    python -m pytest -m gpu tests/gpu/test_hostile_net_gpu.py
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
import textwrap
import time

import bcrypt
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.gpu.test_remediation_gpu import _torch_cuda
from tests.helpers import child_env, wait_until
from tests.hostile_clients import Attack, Scraper
from tests.test_fault_campaign_net import sample as _series
from tests.test_remediation_webhook import alert, payload
from tests.tls_certs import CA

pytestmark = pytest.mark.gpu

TOKEN = "gpu-net-token-0123456789"
SOURCES = ",".join(f"127.0.0.{i}" for i in range(2, 18))
CHILD = """
import time, torch
torch.cuda.init()
held = [torch.empty((i % 7 + 1) * 1024**2, dtype=torch.uint8, device="cuda")
        for i in range(60)]
del held[::2]
torch.cuda.synchronize()
import gpuwatch.probe
assert gpuwatch.probe.current() is not None
print("ready", flush=True)
time.sleep(600)
"""


def test_probe_reads_and_snapshots_go_on_under_idle_connections(daemon, tmp_path):
    if not _torch_cuda():
        pytest.skip("torch with CUDA is not installed here")
    probe_dir = tmp_path / "probe"
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env=child_env(GPUWATCH_PROBE_DIR=str(probe_dir),
                                           GPUWATCH_PROBE_INTERVAL_SECONDS="1"))
    try:
        assert child.stdout.readline().split() == ["ready"], "the torch child did not start"
        pid = str(child.pid)
        ca = CA(tmp_path, "ca")
        ca.issue("server", server=True)
        web = tmp_path / "web.yml"
        web.write_text(yaml.safe_dump({
            "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
            "basic_auth_users": {"p": bcrypt.hashpw(b"pw", bcrypt.gensalt(12)).decode()}}))

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE,
                               (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        d = daemon("--web-config", str(web), wait_ready=False, preexec=limit,
                   config_toml=textwrap.dedent(f"""
                       [nvml]
                       fast_interval_seconds = 1.0
                       [probe]
                       dir = "{probe_dir}"
                       [remediation]
                       cooldown_seconds = 0
                       [webhook]
                       token = "{TOKEN}"
                       """))
        scraper = Scraper(d.address, "p", "pw", str(ca.crt))

        def reserved():
            status, _, body = scraper.get()
            return body if status == 200 and _series(
                body, "gpuwatch_process_allocator_reserved_bytes", pid=pid) else None
        body = wait_until(reserved, 90, what="the child's probe read")
        uuid = next(s.labels["uuid"] for fam in text_string_to_metric_families(body.decode())
                    for s in fam.samples if s.name == "gpuwatch_process_gpu_memory_used_bytes"
                    and s.labels.get("pid") == pid)
        attack = Attack("idle", d.address, 1024, sources=SOURCES)
        try:
            time.sleep(5)
            stamps = []
            for _ in range(15):
                status, _, body = scraper.get()
                assert status == 200, status
                assert _series(body, "gpuwatch_process_allocator_reserved_bytes", pid=pid)
                stamps.append(_series(body, "gpuwatch_last_collect_timestamp_seconds",
                                      source="probes"))
                time.sleep(1)
            assert stamps[-1] > stamps[0] + 8  # probe reads went on
            a = alert(fingerprint="gpu-under-attack", uuid=uuid, pid=int(pid))
            status, _, _ = scraper.request(
                "POST", "/alertmanager", json.dumps(payload(a)).encode(),
                {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
            assert status == 200

            def snapshot_ok():
                body = scraper.get()[2]
                return _series(body, "gpuwatch_remediation_actions_total", action="snapshot",
                               result="ok")
            wait_until(snapshot_ok, 90, what="the probe's snapshot written")
            pickles = list((tmp_path / f"state-{d.port}" / "snapshots").rglob("*.pickle"))
            print(f"snapshots: {pickles}")
            d.proc.send_signal(signal.SIGTERM)
            assert d.proc.wait(15) == 0
        finally:
            seen = attack.stop()
        print(f"attacker: {seen}")
        out = d.output()
        assert "Traceback" not in out and "out of system resource" not in out
    finally:
        child.kill()
        child.wait()
