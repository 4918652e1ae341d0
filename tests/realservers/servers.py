"""Start, load and stop the real servers (loopback, bounded loads)."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.helpers import Proc, free_port, http_get, wait_until
from tests.realservers import build

HERE = Path(__file__).resolve().parent
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
MAX_REQUESTS = 500
MAX_SECONDS = 120.0


def required() -> bool:
    """Every real engine must be there (.ci/run sets it): a missing one fails its tests."""
    return os.environ.get("GPUWATCH_TESTS_REQUIRE_ENGINES") == "1"


def built(make):
    """make() from build, or this test skipped with the reason a user's machine cannot
    have the server (failed instead where every real engine is required)."""
    import pytest

    try:
        return make()
    except build.Unavailable as exc:
        if required():
            pytest.fail(f"real engine required (GPUWATCH_TESTS_REQUIRE_ENGINES=1): {exc}")
        pytest.skip(f"real engine unavailable: {exc}")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, **OFFLINE, **extra}


class Server(Proc):
    """A real server; `metrics_url` is what gpuwatch scrapes."""

    kind = ""
    health_path = "/health"

    def __init__(self, workdir: Path, argv: list[str], name: str, env: dict, base: str,
                 metrics_url: str, timeout: float) -> None:
        self.base = base
        self.metrics_url = metrics_url
        super().__init__(argv, workdir, name, env=env)
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float) -> None:
        def healthy():
            if not self.alive():
                raise RuntimeError(f"{self.kind} exited:\n{self.output()[-3000:]}")
            try:
                return http_get(self.base + self.health_path, 1.0)[0] == 200
            except OSError:
                return False
        wait_until(healthy, timeout, interval=0.25, what=f"{self.kind} health")

    def metrics(self) -> str:
        return http_get(self.metrics_url)[1].decode()


def vllm_model(workdir: Path) -> Path:
    out = workdir / "tiny-llama-hf"
    if not out.exists():
        py = built(build.vllm_python)
        Proc([str(py), str(HERE / "make_tiny_hf.py"), str(out)], workdir, "make-model",
             env=_env()).proc.wait(300)
    return out


class Vllm(Server):
    kind = "vllm"

    def __init__(self, workdir: Path, port: int | None = None, *extra: str,
                 env: dict[str, str] | None = None, timeout: float = 480) -> None:
        port = port or free_port()
        model = vllm_model(workdir)
        argv = [str(built(build.vllm_python)), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(model), "--served-model-name", "tiny-llama",
                "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                "--max-model-len", "512", "--max-num-seqs", "4", "--enforce-eager",
                "--num-gpu-blocks-override", "16", "--enable-prefix-caching", *extra]
        self.port = port
        base = f"http://127.0.0.1:{port}"
        super().__init__(workdir, argv, f"vllm-{port}",
                         _env(VLLM_CPU_KVCACHE_SPACE="1", **(env or {})),
                         base, base + "/metrics", timeout=timeout)


class LlamaServer(Server):
    kind = "llamacpp"

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        port = port or free_port()
        model = workdir / "tiny-llama.gguf"
        if not model.exists():
            Proc([sys.executable, str(HERE / "make_tiny_gguf.py"),
                  str(model)], workdir, "make-gguf", env=os.environ.copy()).proc.wait(120)
        # -t 1: on two cores, more threads spin-wait against the load generator.
        argv = [str(built(build.llama_server)), "-m", str(model), "--host", "127.0.0.1",
                "--port", str(port), "--metrics", "--parallel", "2", "-c", "1024", "-t", "1",
                "--no-webui"]
        self.port = port
        base = f"http://127.0.0.1:{port}"
        super().__init__(workdir, argv, f"llama-server-{port}", _env(), base, base + "/metrics",
                         timeout=60)


class Triton(Server):
    kind = "triton"
    health_path = "/v2/health/ready"

    def __init__(self, workdir: Path) -> None:
        import secrets

        py = built(build.pytriton_python)
        http, grpc, metrics = free_port(), free_port(), free_port()
        self.access_token = secrets.token_urlsafe(16)  # for its model-repository API
        # Its Python-backend stub links libpython by soname: point it at this interpreter's.
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env = _env(TRITON_HTTP_PORT=str(http), TRITON_GRPC_PORT=str(grpc),
                   TRITON_METRICS_PORT=str(metrics), TRITON_ACCESS_TOKEN=self.access_token,
                   TRITON_WORKSPACE=str(workdir / f"triton-{http}"),
                   LD_LIBRARY_PATH=":".join(p for p in (libdir, os.environ.get(
                       "LD_LIBRARY_PATH", "")) if p))
        base = f"http://127.0.0.1:{http}"
        super().__init__(workdir, [str(py), str(HERE / "triton_server.py")],
                         f"triton-{http}", env, base, f"http://127.0.0.1:{metrics}/metrics",
                         timeout=180)
        for model in ("scale", "echo_text"):
            wait_until(lambda m=model: http_get(f"{base}/v2/models/{m}/ready", 1.0)[0] == 200,
                       60, what=f"triton model {model} ready")


def _post(url: str, body: dict, timeout: float = 60.0) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except OSError:
        return 0


def completions(base: str, prompts: list[str], threads: int = 6, max_tokens: int = 32,
                model: str = "tiny-llama", stop: threading.Event | None = None) -> list[int]:
    """One completion per prompt, `threads` at a time; bounded in count and wall time, and
    cut short once `stop` is set."""
    assert base.startswith("http://127.0.0.1:"), "loopback only"
    deadline = time.monotonic() + MAX_SECONDS
    prompts = prompts[:MAX_REQUESTS]

    def one(p: str) -> int:
        if time.monotonic() > deadline or (stop is not None and stop.is_set()):
            return 0
        return _post(base + "/v1/completions", {
            "model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "n_predict": max_tokens})

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, prompts))


def triton_infer(base: str, n: int, threads: int = 4) -> list[int]:
    assert base.startswith("http://127.0.0.1:"), "loopback only"
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                        "data": [1.0, 2.0, 3.0, 4.0]}]}
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: _post(base + "/v2/models/scale/infer", body),
                             range(min(n, MAX_REQUESTS))))


class RoundRobin:
    """One URL in front of several servers' /metrics, answering from each in turn: replicas
    behind a load balancer, as a scraper sees them."""

    def __init__(self, urls: list[str]) -> None:
        import http.server
        import itertools

        turn = itertools.cycle(urls)
        lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with lock:
                    url = next(turn)
                code, body = http_get(url, 5.0)
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/metrics"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Background:
    """A load that runs while the test looks at gpuwatch."""

    def __init__(self, fn, *args, **kwargs) -> None:
        self.result: list[int] = []
        self._t = threading.Thread(target=lambda: self.result.extend(fn(*args, **kwargs)),
                                   daemon=True)
        self._t.start()

    @property
    def running(self) -> bool:
        return self._t.is_alive()

    def join(self, timeout: float = MAX_SECONDS + 10) -> list[int]:
        self._t.join(timeout)
        return self.result
