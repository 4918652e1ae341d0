"""`gpuwatch check` (setup doctor) and `gpuwatch config` (effective configuration, origins,
secrets masked), run as commands against real sockets and files."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

from gpuwatch import config as config_mod
from gpuwatch.effective import display_config
from tests.helpers import REPO, child_env, free_port

FIXTURE = (REPO / "tests/fixtures/engines/vllm-0.33.0-statlogger.prom").read_bytes()


def gpuwatch(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwatch", *argv], capture_output=True,
                          text=True, timeout=120, env=child_env(**(env or {})),
                          stdin=subprocess.DEVNULL)


@pytest.fixture
def engine():
    """A real HTTP server on loopback that serves a vLLM exposition on /metrics."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(FIXTURE + b'vllm:build_info{version="0.33.0"} 1\n')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def write_config(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gpuwatch.toml"
    p.write_text(text)
    return p


def lines_by_name(out: str) -> dict[str, str]:
    return {line.split(":", 1)[0].split(None, 1)[1]: line for line in out.splitlines()}


def test_check_passes_on_a_good_setup_and_names_the_engine(tmp_path, engine):
    cfg = write_config(tmp_path, f'[[engines]]\nname = "vllm-0"\nurl = "{engine}/metrics"\n')
    r = gpuwatch("check", "--config", str(cfg), "--listen", f"127.0.0.1:{free_port()}",
                 "--rules-dir", str(REPO / "alerts"), "--dashboards-dir",
                 str(REPO / "dashboards"), env={"STATE_DIRECTORY": str(tmp_path / "state")})
    assert r.returncode == 0, r.stdout + r.stderr
    got = lines_by_name(r.stdout)
    assert got["engine vllm-0"].startswith("ok") and "vllm, version 0.33.0" in got[
        "engine vllm-0"]
    assert got["listen"].startswith("ok") and got["alerts"].startswith("ok")
    assert got["dashboards"].startswith("ok") and got["state directory"].startswith("ok")
    assert all(line.split()[0] in ("ok", "warn") for line in r.stdout.splitlines())


def test_check_fails_with_the_fix(tmp_path, engine):
    rules = tmp_path / "rules"
    rules.mkdir()
    for f in (REPO / "alerts").glob("*.yml"):
        (rules / f.name).write_text(f.read_text())
    (rules / "gpuwatch.alerts.yml").write_text("groups: []\n")  # an older version's rules
    dead = free_port()
    cfg = write_config(tmp_path, f'events_log = "{tmp_path}/nope/deeper/events.jsonl"\n'
                       f'[[engines]]\nname = "gone"\nurl = "http://127.0.0.1:{dead}"\n'
                       f'[[engines]]\nname = "web"\nurl = "{engine}/other"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = gpuwatch("check", "--config", str(cfg), "--listen", f"127.0.0.1:{port}",
                     "--rules-dir", str(rules),
                     env={"STATE_DIRECTORY": str(tmp_path / "state")})
    assert r.returncode == 1, r.stdout + r.stderr
    got = lines_by_name(r.stdout)
    assert got["engine gone"].startswith("warn") and "unreachable" in got["engine gone"]
    assert got["engine web"].startswith("fail") and "HTTP 404" in got["engine web"]
    assert got["listen"].startswith("fail") and "fix:" in got["listen"]
    assert got["alerts"].startswith("fail") and "gpuwatch.alerts.yml" in got["alerts"]
    assert got["events log"].startswith("fail") and "does not exist" in got["events log"]
    assert "Traceback" not in r.stderr


def without_none(d):
    if isinstance(d, dict):
        return {k: without_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [without_none(v) for v in d]
    return d


def test_config_shows_origins_and_masks_secrets(tmp_path):
    cfg = write_config(tmp_path, 'log_level = "debug"\n[nvml]\nfast_interval_seconds = 1.0\n'
                       '[[engines]]\nname = "e"\nurl = "http://127.0.0.1:8000/metrics"\n'
                       'bearer_token = "tok-SECRET-1"\nheaders = { "X-Api-Key" = "key-SECRET-2" }'
                       '\n')
    r = gpuwatch("config", "--config", str(cfg), "--listen", "127.0.0.1:19999",
                 env={"GPUWATCH_NVML_SLOW_INTERVAL_SECONDS": "0",
                      "GPUWATCH_WEBHOOK_TOKEN": "hook-SECRET-3"})
    assert r.returncode == 0, r.stderr
    assert "SECRET" not in r.stdout
    out = r.stdout.splitlines()
    assert 'listen        = "127.0.0.1:19999"  # flag' in out
    assert any(line.startswith("log_level ") and line.endswith("# file") for line in out)
    assert any(line.startswith("fast_interval_seconds") and line.endswith("# file")
               for line in out)
    assert any(line.startswith("slow_interval_seconds") and line.endswith("# environment")
               for line in out)
    assert any(line.startswith("xid_events") and line.endswith("# default") for line in out)
    assert "[[engines]]  # file" in out
    # The output is TOML that loads back into the same configuration (secrets as masked).
    data = tomllib.loads(r.stdout)
    path = write_config(tmp_path, r.stdout)
    again = config_mod.load(path, environ={})
    assert without_none(display_config(again)) == data
    assert data["listen"] == "127.0.0.1:19999" and data["nvml"]["slow_interval_seconds"] == 0
    assert data["webhook"]["token"] == "***" and data["engines"][0]["bearer_token"] == "***"


def test_shipped_example_config_loads_and_checks(tmp_path):
    example = REPO / "exporters" / "gpuwatch.toml"
    cfg = config_mod.load(example, environ={})
    assert cfg.events_log == "/var/log/gpuwatch/events.jsonl"
    assert cfg.discovery.enabled and cfg.remediation.snapshot.enabled
    assert not cfg.remediation.flush.enabled and not cfg.remediation.signal.enabled
    r = gpuwatch("config", "--config", str(example))
    assert r.returncode == 0 and "# file" in r.stdout
