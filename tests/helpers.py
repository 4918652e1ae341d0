"""Real processes for tests: the daemon, Prometheus and Alertmanager on loopback ports."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child that imports gpuwatch from this checkout, without the
    harness's own GPUWATCH_TEST* switches (they are not the daemon's settings)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_TEST")}
    return {**env, "PYTHONPATH": path, **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_until(fn, timeout: float, interval: float = 0.25, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def eventually(fn, timeout: float = 5.0, interval: float = 0.02) -> bool:
    """fn() becomes true within timeout (no exception when it does not: assert on it)."""
    deadline = time.monotonic() + timeout
    while not fn() and time.monotonic() < deadline:
        time.sleep(interval)
    return bool(fn())


def needs_binary(name: str):
    """Skip a test where `name` is not installed, except in CI (CI=true): there the test runs
    and a missing tool fails it, so a broken CI image cannot pass by skipping."""
    import pytest

    return pytest.mark.skipif(shutil.which(name) is None and os.environ.get("CI") != "true",
                              reason=f"{name} not installed (required where CI=true)")


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(
            f"{name} not found: tests/conftest.py unpacks Debian's prometheus and "
            "prometheus-alertmanager into the test cache (needs apt-get and the archive)")
    return path


class Proc:
    """A child process whose output goes to a file, stopped with SIGTERM then SIGKILL."""

    def __init__(self, argv: list[str], workdir: Path, name: str, env=None,
                 preexec=None) -> None:
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the child
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, cwd=workdir, preexec_fn=preexec)

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


class Daemon(Proc):
    def __init__(self, workdir: Path, *args: str, config_toml: str | None = None,
                 env: dict | None = None, wait_ready: bool = True, preexec=None,
                 module: str = "gpuwatch") -> None:
        """module: what `python -m` runs (tests.fake_nvml_daemon: over a fake GPU)."""
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        argv = [sys.executable, "-m", module, "run", "--listen", self.address]
        if config_toml is not None:
            cfg = workdir / f"gpuwatch-{self.port}.toml"
            cfg.write_text(config_toml)
            argv += ["--config", str(cfg)]
        argv += list(args)
        # State (audit log, snapshots) stays in the test's directory.
        full_env = child_env(**{"STATE_DIRECTORY": str(workdir / f"state-{self.port}"),
                                **(env or {})})
        super().__init__(argv, workdir, f"gpuwatch-{self.port}", env=full_env,
                         preexec=preexec)
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready():
            if not self.alive():
                raise RuntimeError(f"daemon exited: {self.output()}")
            return http_get(self.url + "/readyz", 1.0)[0] == 200
        wait_until(ready, timeout, what="daemon /readyz")

    def get(self, path: str) -> tuple[int, bytes]:
        return http_get(self.url + path)

    def state(self) -> dict:
        return json.loads(self.get("/api/state")[1])

    def metrics(self) -> str:
        return self.get("/metrics")[1].decode()


def _timeout(scrape_interval: str) -> str:
    """The scrape timeout: 5 s, or the interval where it is shorter (Prometheus refuses a
    timeout longer than the interval)."""
    m = re.fullmatch(r"(\d+)s", scrape_interval)
    return scrape_interval if m and int(m.group(1)) < 5 else "5s"


class Prometheus(Proc):
    def __init__(self, workdir: Path, targets: list[str] | None, scrape_interval: str = "1s",
                 rule_files=(), alertmanager_url: str | None = None, job: str = "gpuwatch",
                 scrape: dict | None = None, config: dict | None = None,
                 binary: str | None = None, flags: tuple[str, ...] = (),
                 evaluation_interval: str = "1s"):
        """scrape: more settings of the job (scheme, tls_config, basic_auth...); config:
        more top-level settings (remote_write...); global settings merge; targets None: no
        scrape job at all."""
        binary = binary or require_binary("prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        d = workdir / f"prometheus-{self.port}"
        d.mkdir()
        extra = dict(config or {})
        config = {
            "global": {"scrape_interval": scrape_interval,
                       "evaluation_interval": evaluation_interval,
                       "scrape_timeout": _timeout(scrape_interval),
                       **extra.pop("global", {})},
            "scrape_configs": [] if targets is None else [
                {"job_name": job, "static_configs": [{"targets": targets}], **(scrape or {})}],
            **extra,
        }
        if rule_files:
            config["rule_files"] = [str(Path(f).resolve()) for f in rule_files]
        if alertmanager_url:
            host = urllib.parse.urlparse(alertmanager_url).netloc
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [host]}]}]}
        (d / "prometheus.yml").write_text(yaml.safe_dump(config))
        argv = [binary, f"--config.file={d / 'prometheus.yml'}",
                f"--storage.tsdb.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *flags]
        super().__init__(argv, d, "prometheus")
        wait_until(lambda: http_get(self.url + "/-/ready", 1.0)[0] == 200, 30,
                   what="prometheus ready")

    def api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        _, body = http_get(url, 10.0)
        data = json.loads(body)
        if data.get("status") != "success":
            raise ValueError(f"prometheus {path} {params}: {data}")
        return data["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def wait_for(self, expr: str, timeout: float = 30.0) -> list:
        return wait_until(lambda: self.query(expr), timeout, what=f"PromQL {expr!r}")

    def alerts(self) -> list:
        return self.api("alerts")["alerts"]

    def targets(self) -> list:
        return self.api("targets")["activeTargets"]


class Alertmanager(Proc):
    def __init__(self, workdir: Path, config_yaml: str) -> None:
        binary = require_binary("prometheus-alertmanager")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        d = workdir / f"alertmanager-{self.port}"
        d.mkdir()
        (d / "alertmanager.yml").write_text(config_yaml)
        argv = [binary, f"--config.file={d / 'alertmanager.yml'}",
                f"--storage.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=", "--log.level=warn"]
        super().__init__(argv, d, "alertmanager")
        wait_until(lambda: http_get(self.url + "/-/ready", 1.0)[0] == 200, 30,
                   what="alertmanager ready")

    def alerts(self) -> list:
        return json.loads(http_get(self.url + "/api/v2/alerts")[1])


# The leak life cycle in seconds instead of minutes, so a simulated leak is judged within a
# test (a fast NVML tier, short settle times, a 10 s critical window).
FAST_LEAK_TOML = """
[nvml]
fast_interval_seconds = 1.0

[signals.leak]
confirm_seconds = 5
critical_window_seconds = 10

[signals.leak.lifecycle]
loading_settle_seconds = 3
warmup_settle_seconds = 5
warmup_max_seconds = 15
"""


class LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 for one handler class, until close()."""

    def __init__(self, handler) -> None:
        import threading
        from http.server import ThreadingHTTPServer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class StaticServer(LoopbackServer):
    """A loopback HTTP server answering every GET with the same body (an engine's /metrics,
    or something that is not what the client expects); `routes` (path prefix -> (body,
    content type)) answer their paths with another."""

    def __init__(self, body: bytes, content_type: str = "text/plain",
                 routes: dict[str, tuple[bytes, str]] | None = None) -> None:
        from http.server import BaseHTTPRequestHandler

        routes = routes or {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                data, kind = next(((b, k) for prefix, (b, k) in routes.items()
                                   if self.path.startswith(prefix)), (body, content_type))
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        super().__init__(Handler)
