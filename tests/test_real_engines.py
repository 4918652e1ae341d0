"""gpuwatch against real inference servers on this CPU: vLLM (its CPU build), Triton (PyTriton)
and llama.cpp's llama-server, each serving a tiny model generated here, under bounded loads.

The servers are installed or built once per version into a cache (tests/realservers/build.py);
a cold cache costs about 12 minutes, most of it compiling llama-server.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.realservers import servers

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(1500)]

FAST = """
[signals.kv_cache]
window_seconds = 20
min_queries = 10
[signals.queue]
window_seconds = 30
min_requests = 1
"""


def engine_config(name: str, url: str, kind: str = "auto") -> str:
    return (FAST + f'\n[[engines]]\nname = "{name}"\nurl = "{url}"\nkind = "{kind}"\n'
            "interval_seconds = 1\n")


def engine(d, name: str) -> dict:
    return d.state()["signals"]["engines"][name]


def series(d, metric: str, **labels) -> list[float]:
    sel = "".join(f'(?=[^}}]*{k}="{re.escape(v)}")' for k, v in labels.items())
    pat = re.compile(rf"^{metric}\{{{sel}[^}}]*\}} (\S+)$", re.M)
    return [float(x) for x in pat.findall(d.metrics())]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("servers")


# -- vLLM ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm(workdir):
    s = servers.Vllm(workdir)
    yield s
    s.stop(timeout=30)


def test_vllm_is_scraped_and_recognised(vllm, daemon):
    d = daemon(config_toml=engine_config("vllm-0", vllm.metrics_url))
    wait_until(lambda: series(d, "gpuwatch_engine_up", engine="vllm-0", kind="vllm") == [1.0],
               30, what="engine_up 1 for vllm")
    st = engine(d, "vllm-0")
    assert st["kind"] == "vllm" and st["generation"] == "v1" and st["model"] == "tiny-llama"
    assert st["cache_config"].get("block_size")  # read from vllm:cache_config_info
    # memory facts: awake, and its KV pool of --num-gpu-blocks-override blocks
    pool = int(st["cache_config"]["num_gpu_blocks"]) * int(st["cache_config"]["block_size"])
    assert st["sleep_level"] == 0 and st["kv_pool_tokens"] == pool > 0
    assert series(d, "gpuwatch_engine_sleep_level", engine="vllm-0") == [0.0]
    assert series(d, "gpuwatch_engine_kv_cache_pool_tokens", engine="vllm-0") == [pool]


def test_vllm_is_discovered_from_its_process(vllm, daemon):
    d = daemon(config_toml=FAST + "\n[discovery]\nenabled = true\ninterval_seconds = 1\n"
               "scrape_interval_seconds = 1\n")

    def found():
        engines = d.state()["signals"]["engines"]
        return [e for e in engines.values() if e["kind"] == "vllm" and e["up"]]
    got = wait_until(found, 60, what="vLLM discovered")
    assert str(vllm.port) in got[0]["url"]


def test_vllm_hit_ratio_follows_the_prompts(vllm, daemon):
    d = daemon(config_toml=engine_config("vllm-0", vllm.metrics_url))
    # Longer than three of the CPU backend's 128-token blocks: only whole blocks are cached.
    shared = "hello world the gpu watch metric server token model " * 30
    wait_until(lambda: series(d, "gpuwatch_engine_up", engine="vllm-0") == [1.0], 30)
    # The same long prompt again and again: its prefix is cached after the first request.
    codes = servers.completions(vllm.base, [shared] * 24, threads=4, max_tokens=4)
    assert codes.count(200) == 24
    hit = wait_until(lambda: (engine(d, "vllm-0")["kv_cache_hit_ratio"] or 0) > 0.5 and
                     engine(d, "vllm-0")["kv_cache_hit_ratio"], 30, what="hit ratio > 0.5")
    assert hit <= 1.0
    # Unique prompts afterwards, for longer than the window: the ratio falls near 0.
    unique = [f"{uuid.uuid4().hex} {uuid.uuid4().hex} request prompt decode" * 3
              for _ in range(servers.MAX_REQUESTS)]
    stop = threading.Event()
    bg = servers.Background(servers.completions, vllm.base, unique, threads=2, max_tokens=16,
                            stop=stop)
    try:
        low = wait_until(lambda: (r := engine(d, "vllm-0")["kv_cache_hit_ratio"]) is not None
                         and r < 0.2 and str(r), 100, what="hit ratio near 0")
    finally:
        stop.set()
    assert 0.0 <= float(low) < 0.2
    assert 200 in bg.join()


def test_vllm_queue_kv_usage_and_slis_move_under_load(vllm, daemon, prometheus):
    d = daemon(config_toml=engine_config("vllm-0", vllm.metrics_url))
    prom = prometheus([d.address])
    wait_until(lambda: series(d, "gpuwatch_engine_up", engine="vllm-0") == [1.0], 30)
    seen = {"running": 0.0, "waiting": 0.0, "kv": 0.0}

    def busy():
        st = engine(d, "vllm-0")
        seen["running"] = max(seen["running"], st["requests_running"] or 0)
        seen["waiting"] = max(seen["waiting"], st["requests_waiting"] or 0)
        seen["kv"] = max(seen["kv"], st["kv_cache_usage_ratio"] or 0)
        return seen["running"] > 0 and seen["waiting"] > 0 and seen["kv"] > 0
    prompts = [f"{i} hello world the gpu watch" for i in range(24)]
    bg = servers.Background(servers.completions, vllm.base, prompts, threads=8, max_tokens=96)
    wait_until(busy, 90, interval=0.2, what="running, waiting and KV usage under load")
    assert bg.join().count(200) == 24
    assert seen["running"] <= 4  # --max-num-seqs 4
    # The serving SLIs reach Prometheus: the TTFT p95 of this load, in seconds.
    ttft = prom.wait_for('gpuwatch_engine_time_to_first_token_seconds'
                         '{engine="vllm-0",quantile="0.95"}', timeout=60)
    assert 0 < float(ttft[0]["value"][1]) < 120
    wait_until(lambda: engine(d, "vllm-0")["requests_running"] == 0, 30, what="idle again")
    st = engine(d, "vllm-0")
    assert st["queue_latency_seconds"] and min(st["queue_latency_seconds"].values()) >= 0


def test_vllm_loads_gpuwatch_plugin_and_the_probe_says_there_is_no_cuda(workdir, tmp_path):
    # gpuwatch installed as a distribution, so vLLM finds its entry point like any plugin.
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--target", str(site), str(REPO)], check=True,
                   capture_output=True, timeout=300)
    s = servers.Vllm(workdir, None, env={"PYTHONPATH": str(site),
                                         "GPUWATCH_PROBE_ENABLED": "1",
                                         "GPUWATCH_PROBE_DIR": str(tmp_path / "probe")})
    try:
        # Only the plugin's register() starts a probe in vLLM's processes; its warning is the
        # proof that vLLM loaded it, and that it says why there is nothing to report.
        wait_until(lambda: "is built without CUDA" in s.output(), 60,
                   what="the probe's no-CUDA warning in vLLM's log")
    finally:
        s.stop(timeout=30)


# -- llama.cpp -------------------------------------------------------------------------------

def test_llamacpp_is_recognised_and_its_restart_counted_once(workdir, daemon):
    s = servers.LlamaServer(workdir)
    port = s.port
    try:
        d = daemon(config_toml=engine_config("llama-0", s.metrics_url))
        wait_until(lambda: series(d, "gpuwatch_engine_up", engine="llama-0",
                                  kind="llamacpp") == [1.0], 30, what="llama.cpp up")
        bg = servers.Background(servers.completions, s.base, ["hello world"] * 60, threads=6,
                                max_tokens=256)
        wait_until(lambda: (engine(d, "llama-0")["requests_running"] or 0) > 0, 60,
                   interval=0.2, what="llama.cpp busy")
        assert bg.join().count(200) == 60
        wait_until(lambda: engine(d, "llama-0")["requests_running"] == 0, 30)
        assert engine(d, "llama-0")["restarts_detected"] == 0
        s.stop()
        wait_until(lambda: series(d, "gpuwatch_engine_up", engine="llama-0") == [0.0], 30,
                   what="llama.cpp down")
        s = servers.LlamaServer(workdir, port)
        servers.completions(s.base, ["hello world"] * 2, threads=2, max_tokens=8)
        wait_until(lambda: engine(d, "llama-0")["restarts_detected"] == 1, 30,
                   what="one restart")
        st = engine(d, "llama-0")
        assert st["up"] and st["restarts_detected"] == 1
        for name in ("preemptions_total", "queue_requests_total"):
            assert st[name] is None or st[name] >= 0
    finally:
        s.stop()


# -- Triton ----------------------------------------------------------------------------------

def test_triton_is_recognised_and_its_queue_read(workdir, daemon):
    s = servers.Triton(workdir)
    try:
        d = daemon(config_toml=engine_config("triton-0", s.metrics_url))
        wait_until(lambda: series(d, "gpuwatch_engine_up", engine="triton-0",
                                  kind="triton") == [1.0], 30, what="Triton up")
        assert servers.triton_infer(s.base, 200, threads=8).count(200) == 200
        st = wait_until(lambda: (st := engine(d, "triton-0"))["queue_requests_total"]
                        and st["queue_requests_total"] >= 200 and st, 30,
                        what="Triton's queue counters")
        assert st["queue_seconds_total"] >= 0
        assert st["queue_latency_mean_seconds"] is None or st["queue_latency_mean_seconds"] >= 0
    finally:
        s.stop()
