"""What a default daemon imports: the real `gpuwatch run` under `python -X importtime`, which
names every module as it is first imported, for the whole life of the process: startup,
ticks, and a scrape of every endpoint. `run` checks its flags, then execs the daemon's own
process (gpuwatch.serve), whose imports are the ones that stay. What a default run does not
use stays out (its memory is most of the daemon's own; see benchmarks/footprint.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from tests.helpers import REPO, child_env, free_port, http_get, wait_until

pytestmark = pytest.mark.integration

# Each is imported on first use by what needs it, and a default run needs none of them.
NOT_IN_A_DEFAULT_RUN = {
    "click": "the command line: `run` execs the daemon's own process, which never imports it",
    "gpuwatch.cli": "the same",
    "yaml": "only a web configuration file is YAML",
    "grpc": "the kubelet's pod-resources client, only where its socket exists",
    "google.protobuf": "the same",
    "gpuwatch.views.report": "`gpuwatch report`",
    "gpuwatch.monitoring.dashboards": "`gpuwatch dashboards`",
    "gpuwatch.monitoring.rules": "`gpuwatch alerts`",
    "grafanalib": "the same",
    "aiohttp": "the engine scraper's HTTP client, only once an engine is found",
    "prometheus_client": "the engine exposition parser, the same",
    "urllib.request": "the Kubernetes API client, only where it is configured",
    "http.client": "the same",
    "email": "the same",
    "bcrypt": "basic auth",
    "rich": "`gpuwatch status`",
    "gpuwatch.exposition": "the engines' exposition parsers, only once an engine is sampled",
    "gpuwatch.signals.engine": "the engines' signals, the same",
    "importlib.resources": "the shipped files are read beside their modules",
    "zipfile": "the same",
    "statistics": "the leak detector's own median",
    "gzip": "only a .gz recording",
    "secrets": "tokens are os.urandom's",
    "encodings.idna": "the listen address is resolved as ASCII bytes",
    "_ssl": "asyncio's TLS (and OpenSSL), only once a web configuration or a client needs it",
    "_hashlib": "OpenSSL's libcrypto: event ids are hashlib's own blake2b, without it",
    "gpuwatch.views.cli": "`gpuwatch report` and `status`: commands are imported when named",
    "gpuwatch.monitoring": "`gpuwatch alerts` and `dashboards`, the same",
    "gpuwatch.nodehealth.npd": "`gpuwatch npd`, the same",
    "gpuwatch.thresholds.cli": "`gpuwatch thresholds`, the same",
    "gpuwatch.attribution.cli": "`gpuwatch attribution`, the same",
    "gpuwatch.webconfig": "TLS and basic auth, only with a web configuration file",
    "hmac": "the same, and the webhook's token check",
    "gpuwatch.remediation.webhook": "made at Alertmanager's first request",
    "gpuwatch.remediation.hooks.snapshot": "each hook once an action of its kind is checked",
    "gpuwatch.remediation.hooks.flush": "the same",
    "gpuwatch.remediation.hooks.signal": "the same",
    "gpuwatch.remediation.hooks.exec": "the same",
    "gpuwatch.remediation.hooks.probe_channel": "the same",
    "gpuwatch.remediation.flushing": "the same",
    "gpuwatch.sources.oom_records": "OOM records, once a probe has published",
    "gpuwatch.probe_channel.oom": "the same",
    "gpuwatch.probe_channel.requests": "the same, and requests to probes",
    "gpuwatch.attribution.kubeapi": "pods, only on a node whose GPU processes run in pods",
    "json": "the same",
    "gpuwatch.attribution.hpc": "only a configured job-mapping directory",
    "gpuwatch.recording": "only with record",
    "gpuwatch.eventslog": "only with events_log",
}


def _imported(stderr: str) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^import time:[^|]*\|[^|]*\|\s*(\S+)",
                                                    stderr, re.M)}


def test_default_daemon_imports_nothing_it_does_not_use(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "gpuwatch", "run", "--listen",
         f"127.0.0.1:{port}"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=child_env(STATE_DIRECTORY=str(tmp_path / "state")))
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_get(url + "/readyz", 1.0)[0] == 200, 60, what="/readyz")
        for path in ("/metrics", "/api/state", "/", "/healthz", "/nothing-here"):
            assert http_get(url + path, 5.0)[0] in (200, 404)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr[-3000:]
    header = "import time: self [us] | cumulative | imported package"
    assert stderr.count(header) == 2, "run did not exec the daemon's own process"
    modules = _imported(stderr.rpartition(header)[2])
    assert "gpuwatch.daemon" in modules and "gpuwatch.exporter.server" in modules
    loaded = {name: why for name, why in NOT_IN_A_DEFAULT_RUN.items()
              if any(m == name or m.startswith(name + ".") for m in modules)}
    assert loaded == {}


def test_discovery_reads_listening_sockets_only_for_configured_local_engines(monkeypatch):
    """psutil.net_connections walks every process's descriptors (tens of ms of CPU on a busy
    host, every discovery pass): only a configured local engine needs it."""
    from gpuwatch.engines import discovery as disc
    from gpuwatch.engines.config import DiscoveryConfig, EngineConfig
    from gpuwatch.sources.engines import EngineSource

    calls = []
    monkeypatch.setattr(disc, "scan", lambda kinds=(): [])
    monkeypatch.setattr(disc, "listeners", lambda: calls.append(1) or {8000: 4242})
    assert EngineSource([], DiscoveryConfig())._scan() == ([], {})
    remote = EngineConfig(name="r", url="http://10.1.2.3:8000/metrics")
    assert EngineSource([remote], DiscoveryConfig())._scan() == ([], {})
    assert calls == []
    local = EngineConfig(name="l", url="http://127.0.0.1:8000/metrics")
    assert EngineSource([local], DiscoveryConfig())._scan() == ([], {8000: 4242})
    assert calls == [1]
