"""gpuwatch against real inference servers on this CPU: vLLM (its CPU build), Triton (PyTriton)
and llama.cpp's llama-server, each serving a tiny model generated here, under bounded loads.

The servers are installed or built once per version into a cache (tests/realservers/build.py);
a cold cache costs about 12 minutes, most of it compiling llama-server.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from gpuwatch.monitoring import rules
from tests.helpers import wait_until
from tests.realservers import servers
from tests.realservers.client import OpenAIClient, TritonClient
from tests.test_monitoring_integration import _rule_files

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
    """The engine's /api/state ({} until it has been scraped)."""
    return d.state()["signals"]["engines"].get(name, {})


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

    def found():  # this test's server (another vLLM on the host is discovered too)
        engines = d.state()["signals"]["engines"]
        return [e for e in engines.values() if e["kind"] == "vllm" and e["up"]
                and f":{vllm.port}/" in e["url"]]
    got = wait_until(found, 60, what="vLLM discovered")
    assert got[0]["pids"] and vllm.proc.pid in got[0]["pids"]


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
    ttft = prom.wait_for('gpuwatch_engine_time_to_first_token_window_seconds'
                         '{engine="vllm-0",quantile="0.95"}', timeout=60)
    assert 0 < float(ttft[0]["value"][1]) < 120
    wait_until(lambda: engine(d, "vllm-0")["requests_running"] == 0, 30, what="idle again")
    st = engine(d, "vllm-0")
    assert st["queue_latency_seconds"] and min(st["queue_latency_seconds"].values()) >= 0


# The window holds a whole client run; a queue objective under vLLM's first bucket (0.3 s),
# where "p95 at most 0.3 s" must never be judged over it.
TRUTH = """
[signals.queue]
window_seconds = 900
slo_seconds = 0.25
min_requests = 1
"""


def counts(st: dict) -> dict:
    return {"ok": st["client_requests_total"].get("ok", 0.0),
            "error": st["client_requests_total"].get("error", 0.0),
            "finished": sum(st["requests_finished_total"].values()),
            "generated": st["generation_tokens_total"] or 0.0,
            "e2e_n": st["sli_requests_total"].get("e2e", 0.0),
            "e2e_s": st["sli_seconds_total"].get("e2e", 0.0)}


def test_vllm_serving_signals_match_a_client_that_records_its_truth(vllm, daemon, prometheus,
                                                                     tmp_path):
    # one answered request first, so that its HTTP counters exist before gpuwatch's first
    # scrape: every request of the run below is an increase inside gpuwatch's window
    warm = OpenAIClient(vllm.base, "tiny-llama")
    warm.ok(max_tokens=2)
    assert warm.truth.statuses[200] == 1
    d = daemon(config_toml=TRUTH + f'\n[[engines]]\nname = "vllm-0"\nurl = "{vllm.metrics_url}"'
               '\ninterval_seconds = 1\n')
    # the shipped rules, generated with that queue objective; Prometheus scrapes the engine too
    p = rules.RuleParams(queue_latency_slo_seconds=0.25)
    # every 2 s: under load, on 2 cores, a scrape of either can take more than 1 s
    prom = prometheus([d.address, vllm.metrics_url.split("/")[2]], scrape_interval="2s",
                      rule_files=_rule_files(tmp_path, p=p))
    st = wait_until(lambda: (e := engine(d, "vllm-0")).get("up") and e, 30, what="vLLM read")
    assert st["version"] == "0.32.0"  # from its /version
    before = counts(st)
    sent_at = time.time()
    truth = OpenAIClient(vllm.base, "tiny-llama").mix(ok=30, bad=10, abort=6, threads=3,
                                                      max_tokens=16)
    done_at = time.time()
    assert truth.sent == 46 and truth.statuses[200] == 30 and truth.errors == 10
    # what its HTTP layer answered reaches gpuwatch within a scrape
    wait_until(lambda: (c := counts(engine(d, "vllm-0")))["ok"] + c["error"]
               - before["ok"] - before["error"] >= truth.sent, 30, what="every request counted")
    st = engine(d, "vllm-0")
    after = counts(st)
    delta = {k: after[k] - before[k] for k in after}
    assert delta["error"] == truth.errors  # refused with 400/404: never in the engine's counters
    assert delta["ok"] == truth.statuses[200] + truth.aborted  # a lost client is a 200 there
    assert delta["finished"] == truth.statuses[200]  # vLLM's engine counts no abort
    assert st["request_error_ratios"]["client"] == pytest.approx(truth.error_ratio())
    assert st["request_error_ratios"]["engine"] == 0.0
    # tokens: what the answers said, plus what the abandoned streams got before they left
    assert truth.completion_tokens <= delta["generated"] <= (
        truth.completion_tokens + 200 * truth.aborted)
    # the engine's end-to-end mean of the answered requests, and the client's own (which
    # adds HTTP and tokenizing around it)
    engine_mean = delta["e2e_s"] / delta["e2e_n"]
    client_mean = sum(truth.seconds) / len(truth.seconds)
    assert delta["e2e_n"] == truth.statuses[200]
    assert 0.5 * client_mean <= engine_mean <= 1.05 * client_mean, (engine_mean, client_mean)
    assert st["sli_mean_seconds"]["e2e"] == pytest.approx(engine_mean, rel=0.05)
    assert st["restarts_total"] == 0
    # tokens/s through gpuwatch in Prometheus is the engine's own, a scrape behind: both
    # rates over the run, and the counts once it is over
    def rates() -> tuple[float, float] | None:
        # over the whole run, a little after it (the mix returns once its aborted streams
        # are given up, which can be long after the last token)
        if time.time() < done_at + 10:
            return None
        at, w = {"time": done_at + 10}, f"{int(done_at + 20 - sent_at)}s"
        a = prom.api("query", query=f"rate(gpuwatch_engine_generation_tokens_total[{w}])", **at)
        b = prom.api("query", query=f"sum(rate(vllm:generation_tokens_total[{w}]))", **at)
        return (float(a["result"][0]["value"][1]), float(b["result"][0]["value"][1])) \
            if a["result"] and b["result"] else None
    ours, theirs = wait_until(rates, 30, what="both token rates in Prometheus")
    if ours == theirs == 0:
        # Seen on a quiet 2-vCPU machine: vLLM's own generation counter, scraped by
        # Prometheus, stood at a few tokens while the daemon counted every answer's tokens.
        # Not understood yet; the checks above hold, the rest is not reached.
        pytest.xfail("vLLM's generation counter did not move in Prometheus during the run")
    assert theirs > 0 and abs(ours - theirs) <= 0.1 * theirs, (ours, theirs)
    same = 'gpuwatch_engine_generation_tokens_total - on () sum(vllm:generation_tokens_total)'
    wait_until(lambda: (r := prom.query(same)) and float(r[0]["value"][1]) == 0, 30,
               what="gpuwatch's token count equal to the engine's")
    # the queue: its p95 is "at most 0.3 s" (an empty queue, from buckets that start there),
    # never judged against the 0.25 s objective, neither by the daemon nor by the rules
    assert "0.95" in st["sli_below_resolution"].get("queue", []), st["sli_quantiles_seconds"]
    assert not [e for e in d.state()["recent_events"] if e.get("signal") == "queue_latency"]
    # the client's failures page through the shipped error-budget alert, per model
    burning = wait_until(lambda: [a for a in prom.alerts()
                                  if a["labels"]["alertname"] == "GpuwatchEngineErrorBudgetBurn"
                                  and a["labels"]["severity"] == "critical"], 90,
                         what="the error budget burn")
    assert burning[0]["labels"]["model"] == "tiny-llama"
    assert not [a for a in prom.alerts() if a["labels"]["alertname"] in (
        "GpuwatchQueueLatencyHigh", "GpuwatchTimeToFirstTokenBudgetBurn",
        "GpuwatchKvCacheHitRatioLow")]
    info = prom.query('gpuwatch_engine_info{engine="vllm-0"}')
    assert info[0]["metric"]["version"] == "0.32.0"


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

def test_llamacpp_is_recognised_and_its_restart_counted_once(workdir, daemon, prometheus):
    s = servers.LlamaServer(workdir)
    port = s.port
    try:
        # a window that holds the whole run, to compare with what the client saw of all of it
        d = daemon(config_toml=TRUTH + f'\n[[engines]]\nname = "llama-0"\n'
                   f'url = "{s.metrics_url}"\ninterval_seconds = 1\n')
        prom = prometheus([d.address])
        wait_until(lambda: series(d, "gpuwatch_engine_up", engine="llama-0",
                                  kind="llamacpp") == [1.0], 30, what="llama.cpp up")
        # its model from /props (no metric names it), its build from the same
        st = engine(d, "llama-0")
        assert st["model"] == "tiny-llama.gguf" and st["version"]
        client = OpenAIClient(s.base, "tiny-llama")
        bg = servers.Background(lambda: [client.mix(ok=40, bad=6, abort=0, threads=4,
                                                    max_tokens=64)])
        # busy as the daemon saw it, while the load lasts (a loaded machine makes the load
        # slower, not shorter; the tiny model alone may finish it between two scrapes)
        began, busy = time.monotonic(), False
        while bg.running and not busy:
            busy = (engine(d, "llama-0")["requests_running"] or 0) > 0
            time.sleep(0.2)
        lasted = time.monotonic() - began
        bg.join()
        truth = client.truth
        assert truth.statuses[200] >= 40 and truth.timings["predicted_n"] > 0
        assert busy or lasted < 3, f"the load lasted {lasted:.0f} s and was never seen running"
        wait_until(lambda: engine(d, "llama-0")["requests_running"] == 0, 30)
        # the mean time per decoded token, from its exposition, is the server's own timings
        decode = truth.timings["predicted_ms"] / truth.timings["predicted_n"] / 1000
        st = wait_until(lambda: (st := engine(d, "llama-0"))["generation_tokens_total"]
                        and st["generation_tokens_total"] >= truth.timings["predicted_n"]
                        and st, 30, what="every decoded token counted")
        assert st["sli_mean_seconds"]["itl"] == pytest.approx(decode, rel=0.1)
        assert "ptpt" in st["sli_mean_seconds"]
        # it counts no failure at all: no error ratio rather than a fabricated 0 %
        assert "request_error_ratios" not in st or st["request_error_ratios"] == {}
        assert "HTTP status" in st["missing"]["client_request_error_ratio"]
        assert st["restarts_detected"] == 0
        s.stop()
        wait_until(lambda: series(d, "gpuwatch_engine_up", engine="llama-0") == [0.0], 30,
                   what="llama.cpp down")
        s = servers.LlamaServer(workdir, port)
        servers.completions(s.base, ["hello world"] * 2, threads=2, max_tokens=8)
        wait_until(lambda: engine(d, "llama-0")["restarts_detected"] == 1, 30,
                   what="one restart")
        st = engine(d, "llama-0")
        assert st["up"] and st["restarts_detected"] == 1 and st["restarts_total"] == 1
        for name in ("preemptions_total", "queue_requests_total"):
            assert st[name] is None or st[name] >= 0
        # the restart reaches Prometheus within the scrape lag, as a counter
        prom.wait_for('gpuwatch_engine_restarts_total{engine="llama-0"} == 1', timeout=15)
    finally:
        s.stop()


def test_two_real_llamacpp_servers_behind_one_url_are_ambiguous_not_restarts(workdir, daemon):
    """Replicas behind one URL with no process_start_time_seconds (llama.cpp has none): their
    counters go back at almost every scrape. Read as restarts, each flip would add the
    other's totals: rates, ratios and restarts invented from nothing."""
    a, b = servers.LlamaServer(workdir), servers.LlamaServer(workdir)
    proxy = None
    try:
        # only one of them serves: their counters differ
        assert servers.completions(a.base, ["hello world"] * 4, threads=2,
                                   max_tokens=32).count(200) == 4
        proxy = servers.RoundRobin([a.metrics_url, b.metrics_url])
        d = daemon(config_toml=engine_config("llama-lb", proxy.url))
        st = wait_until(lambda: (st := engine(d, "llama-lb")).get("ambiguous") and st, 30,
                        what="the endpoint marked ambiguous")
        assert st["up"] and "several processes" in st["reason"]
        assert st["generation_tokens_total"] is None and st["prefix_cache_queries_total"] is None
        time.sleep(5)  # more flips change nothing
        st = engine(d, "llama-lb")
        assert st["ambiguous"] and st["restarts_total"] <= 1
        assert series(d, "gpuwatch_engine_ambiguous", engine="llama-lb") == [1.0]
        assert series(d, "gpuwatch_engine_generation_tokens_total", engine="llama-lb") == []
        assert series(d, "gpuwatch_engine_up", engine="llama-lb") == [1.0]
    finally:
        if proxy is not None:
            proxy.stop()
        a.stop()
        b.stop()


# -- Triton ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def triton(workdir):
    s = servers.Triton(workdir)
    yield s
    s.stop()


def triton_config(s, extra: str = "") -> str:
    # its version is on its HTTP port (/v2), not on the metrics port
    return engine_config("triton-0", s.metrics_url) + f'info_url = "{s.base}/v2"\n' + extra


def test_triton_is_recognised_and_its_queue_read(triton, daemon):
    d = daemon(config_toml=triton_config(triton))
    wait_until(lambda: series(d, "gpuwatch_engine_up", engine="triton-0",
                              kind="triton") == [1.0], 30, what="Triton up")
    assert servers.triton_infer(triton.base, 200, threads=8).count(200) == 200
    st = wait_until(lambda: (st := engine(d, "triton-0"))["queue_requests_total"]
                    and st["queue_requests_total"] >= 200 and st, 30,
                    what="Triton's queue counters")
    assert st["queue_seconds_total"] >= 0
    assert st["queue_latency_mean_seconds"] is None or st["queue_latency_mean_seconds"] >= 0


def test_triton_keeps_each_models_errors_its_own_quantiles_and_one_engine_series(
        triton, daemon, prometheus):
    d = daemon(config_toml=triton_config(triton))
    prom = prometheus([d.address])
    wait_until(lambda: engine(d, "triton-0").get("up"), 30, what="Triton up")
    client = TritonClient(triton.base)
    for _ in range(60):
        client.scale()
    for i in range(20):
        client.echo("fail" if i % 4 == 0 else "hello")
    failed = sum(n for (m, status), n in client.by_model.items()
                 if m == "echo_text" and status != 200)
    assert failed == 5 and client.by_model[("echo_text", 200)] == 15
    assert client.by_model[("scale", 200)] == 60

    def echo_done():
        st = engine(d, "triton-0")
        m = st.get("models", {}).get("echo_text", {})
        done = sum(m.get("requests_finished_total", {}).values())
        return st if done >= 20 and "engine" in m.get("request_error_ratios", {}) else None
    st = wait_until(echo_done, 30, what="echo_text's 20 requests in gpuwatch")
    assert st["model"] == "" and st["version"].startswith("2.")  # from /v2
    echo, scale = st["models"]["echo_text"], st["models"]["scale"]
    # one model fails 25 % of its requests: not diluted by the other's traffic
    assert echo["request_error_ratios"]["engine"] == pytest.approx(5 / 20)
    assert scale["request_error_ratios"]["engine"] == 0.0
    assert echo["requests_finished_total"]["error"] == 5
    # Triton's own quantiles of the end-to-end time (its summaries, over its own window:
    # this server's earlier tests too), and gpuwatch's mean over this run
    assert scale["sli_quantiles_from_engine"]["e2e"] == ["0.5", "0.95", "0.99"]
    q = scale["sli_quantiles_seconds"]["e2e"]
    assert 0 < q["0.5"] <= q["0.95"] <= q["0.99"] < 60
    assert 0 < scale["sli_mean_seconds"]["e2e"] <= max(client.truth.seconds)
    ratio = prom.wait_for('gpuwatch_engine_request_error_ratio{model="echo_text",'
                          'seen_by="engine"}', timeout=30)
    assert float(ratio[0]["value"][1]) == pytest.approx(0.25)
    # engine_up kept one label set (model="", which Prometheus stores as no model label)
    ups = prom.query('count_over_time(gpuwatch_engine_up{engine="triton-0"}[5m])')
    assert [u["metric"].get("model", "") for u in ups] == [""]


def recorded_counts(path, engine_name: str, model: str) -> list[tuple[float, float]]:
    """(scrape time, nv_inference_request_success of the model) of every recorded scrape."""
    from gpuwatch.recording import read_recording

    needle = f'nv_inference_request_success{{model="{model}",version="1"}} '
    out = []
    for tick in read_recording(str(path))[1]:
        for e in tick.engines:
            if e.name == engine_name and e.exposition:
                line = next(x for x in e.exposition.splitlines() if x.startswith(needle))
                out.append((e.t + (e.duration_seconds or 0.0), float(line.rsplit(" ", 1)[1])))
    return out


def test_triton_cadence_each_scrape_changes_the_series_once_and_shows_at_the_next(
        triton, daemon, prometheus, tmp_path):
    """A steady real engine, seen through gpuwatch in a real Prometheus and by itself."""
    rec = tmp_path / "cadence.jsonl"
    d = daemon("--record", str(rec), config_toml=triton_config(triton))
    prom = prometheus([d.address, triton.metrics_url.split("/")[2]])
    wait_until(lambda: engine(d, "triton-0").get("up"), 30, what="Triton up")
    client = TritonClient(triton.base)
    load = servers.Background(lambda: [client.steady(15.0, 50.0)])
    time.sleep(45)
    ours = 'gpuwatch_engine_requests_finished_total{engine="triton-0",model="scale",reason="ok"}'
    theirs = 'nv_inference_request_success{model="scale"}'
    seen = prom.query(f"{ours}[30s]")[0]["values"]
    deviation = []
    for k in range(10):  # the last 10 s: every rate over 10 s, both ways
        at = time.time() - k
        a = prom.api("query", query=f"rate({ours}[10s])", time=at)["result"]
        b = prom.api("query", query=f"rate({theirs}[10s])", time=at)["result"]
        if a and b and float(b[0]["value"][1]) > 0:
            deviation.append(abs(float(a[0]["value"][1]) / float(b[0]["value"][1]) - 1))
    load.join()
    d.stop()
    scrapes = [(t, v) for t, v in recorded_counts(rec, "triton-0", "scale")
               if float(seen[0][0]) - 1 <= t <= float(seen[-1][0])]
    changed = sum(1 for (_, a), (_, b) in itertools.pairwise(scrapes) if b != a)
    changes = sum(1 for (_, a), (_, b) in itertools.pairwise(seen) if b != a)
    # one change per engine scrape (not one per host tick of 2 s: half as many)
    assert changed >= 20 and changes >= 0.8 * changed, (changes, changed)
    # each Prometheus sample holds the engine scrape that landed before it
    fresh = 0
    for t, v in seen:
        before = [c for ts, c in scrapes if ts <= float(t) - 0.3]
        fresh += bool(before) and float(v) >= before[-1]
    assert fresh >= 0.9 * len(seen), (fresh, len(seen))
    # the rate Prometheus computes through gpuwatch is the engine's own
    assert len(deviation) >= 8 and sorted(deviation)[len(deviation) // 2] < 0.05, deviation


def test_triton_with_no_model_loaded_is_up_and_serves_nothing(triton, daemon, prometheus):
    """Last of the Triton tests: it unloads the models."""
    import urllib.request

    d = daemon(config_toml=triton_config(triton))
    prom = prometheus([d.address])
    wait_until(lambda: engine(d, "triton-0").get("models_loaded"), 30, what="models loaded")
    for model in ("scale", "echo_text"):
        req = urllib.request.Request(f"{triton.base}/v2/repository/models/{model}/unload",
                                     data=b"{}", method="POST",
                                     headers={"triton-access-token": triton.access_token})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
    st = wait_until(lambda: (st := engine(d, "triton-0"))["models_loaded"] == 0 and st, 60,
                    what="no model loaded")
    assert st["up"] and st["models"] == {}
    time.sleep(3)
    state = d.state()
    assert not [e for e in state["recent_events"] if e.get("signal") == "engine_down"]
    models = prom.wait_for('gpuwatch_engine_models{engine="triton-0"} == 0', timeout=30)
    assert "model" not in models[0]["metric"]
    ups = prom.query('count_over_time(gpuwatch_engine_up{engine="triton-0"}[5m])')
    assert [u["metric"].get("model", "") for u in ups] == [""]
    assert prom.query('gpuwatch_engine_up{engine="triton-0"}')[0]["value"][1] == "1"


# The queue objective under vLLM's first queue bucket (0.3 s), judged on a single request;
# latency objectives a CPU build meets, so that only the queue and the errors are in question.
QUIET = rules.RuleParams(queue_latency_slo_seconds=0.25, queue_min_requests=1,
                         ttft_slo_seconds=60.0, e2e_slo_seconds=120.0, slo_min_requests=1)
SILENT = ("GpuwatchQueueLatencyHigh", "GpuwatchTimeToFirstTokenBudgetBurn",
          "GpuwatchEndToEndLatencyBudgetBurn")


def _range(prom, expr: str, start: float, end: float) -> list:
    """Every evaluation of expr over [start, end], one a second: what a rule would have seen."""
    return prom.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                    step="1")["result"]


def test_vllm_empty_then_idle_queue_pages_nothing_and_a_tenth_failing_reads_a_tenth(
        vllm, daemon, prometheus, tmp_path):
    warm = OpenAIClient(vllm.base, "tiny-llama")
    warm.ok(max_tokens=2)  # its HTTP counters exist before gpuwatch's first scrape
    d = daemon(config_toml=TRUTH + f'\n[[engines]]\nname = "vllm-0"\nurl = "{vllm.metrics_url}"'
               '\ninterval_seconds = 1\n')
    # the shipped rules with those objectives, every alert's `for` 0 s: an expression that
    # holds at a single evaluation fires at once, so a run of evaluations is long enough
    prom = prometheus([d.address], scrape_interval="2s",
                      rule_files=_rule_files(tmp_path, pending="0s", p=QUIET))
    st = wait_until(lambda: (e := engine(d, "vllm-0")).get("up") and e, 30, what="vLLM read")
    before = sum(st["client_requests_total"].values())
    # the error series exists before this test's first refusal (at 0 on a fresh engine; the
    # module's vLLM may have refused requests of other tests): rate() then sees the first one
    prom.wait_for('gpuwatch_engine_client_requests_total{engine="vllm-0",outcome="error"} >= 0')
    start = time.time()
    # one request at a time, every tenth refused, over a minute or so: the queue stays empty
    client = OpenAIClient(vllm.base, "tiny-llama")
    for k in range(4):
        truth = client.mix(ok=9, bad=1, abort=0, threads=1, max_tokens=4)
        if k < 3:
            time.sleep(10)
    assert truth.sent == 40 and truth.errors == 4 and truth.error_ratio() == 0.1
    wait_until(lambda: sum(engine(d, "vllm-0")["client_requests_total"].values())
               - before >= truth.sent, 30, what="every request counted")
    st = engine(d, "vllm-0")
    # over the daemon's window, whose first sample may fall inside the first batch: a tenth
    # within a request or two
    assert st["request_error_ratios"]["client"] == pytest.approx(0.1, abs=0.02)
    assert st["request_error_ratios"]["engine"] == 0.0  # its engine never saw the refusals
    ratio = wait_until(lambda: prom.query('gpuwatch_engine_request_error_ratio'
                                          '{engine="vllm-0",seen_by="client"}'), 30)
    assert float(ratio[0]["value"][1]) == pytest.approx(0.1, abs=0.02)
    # the shipped recording rule, across replicas: rates of two counters scraped together
    rule = 'model:gpuwatch_engine_request_errors:ratio_rate5m{model="tiny-llama"}'
    try:
        burn = prom.wait_for(rule, 60)
    except TimeoutError:  # what the rule had to go on
        raise AssertionError([prom.query("gpuwatch_engine_client_requests_total"),
                              prom.query("model:gpuwatch_engine_requests:rate5m"),
                              [r for g in prom.api("rules")["groups"] for r in g["rules"]
                               if r.get("health") != "ok"]]) from None
    assert float(burn[0]["value"][1]) == pytest.approx(0.1, abs=0.02)
    # then nothing, for long enough that the 5-minute request counts still hold the run
    time.sleep(90)
    end = time.time()
    st = engine(d, "vllm-0")
    assert "0.95" in st["sli_below_resolution"].get("queue", []), st["sli_quantiles_seconds"]
    assert st["requests_waiting"] == 0 and st["requests_running"] == 0
    q = 'gpuwatch_engine_queue_latency_window_seconds{engine="vllm-0",quantile="0.95"}'
    # what would page without the resolution: "p95 0.3 s" over 0.25 s, on enough requests
    assert _range(prom, f"{q} > 0.25", start, end)
    assert _range(prom, 'increase(gpuwatch_engine_queue_latency_seconds_count'
                        '{engine="vllm-0"}[5m]) >= 1', start, end)
    shipped = next(r["expr"] for g in rules.alerts_document(QUIET)["groups"]
                   for r in g["rules"] if r.get("alert") == "GpuwatchQueueLatencyHigh")
    assert not _range(prom, shipped, start, end)
    assert not _range(prom, f'ALERTS{{alertname=~"{"|".join(SILENT)}"}}', start, end)
    assert not [e for e in d.state()["recent_events"] if e.get("signal") == "queue_latency"]


# -- last: this kills the module's vLLM for good ---------------------------------------------

def test_a_killed_discovered_vllm_pages_through_the_shipped_engine_down_alert(vllm, daemon,
                                                                              prometheus):
    import psutil

    d = daemon(config_toml="[discovery]\nenabled = true\ninterval_seconds = 1\n"
               "scrape_interval_seconds = 1\n")
    shipped = [REPO / "alerts" / "gpuwatch.rules.yml", REPO / "alerts" / "gpuwatch.alerts.yml"]
    # a failed scrape (a 1 s timeout on a loaded machine) would mark the series stale and
    # restart the alert's `for`
    prom = prometheus([d.address], rule_files=shipped, scrape_interval="2s")

    def discovered():
        return next((n for n, e in d.state()["signals"]["engines"].items()
                     if e["kind"] == "vllm" and e["up"] and f":{vllm.port}/" in e["url"]), None)
    name = wait_until(discovered, 60, what="vLLM discovered")
    prom.wait_for(f'gpuwatch_engine_up{{engine="{name}"}} == 1', 30)
    family = [vllm.proc.pid, *(c.pid for c in psutil.Process(vllm.proc.pid).children(True))]
    for pid in family:  # the API server and its engine core, at once
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    killed = time.monotonic()
    # the discovery scan sees it gone, but it is still scraped: down at the next scrape
    wait_until(lambda: series(d, "gpuwatch_engine_up", engine=name) == [0.0], 30,
               what="engine_up 0 after the kill")
    assert time.monotonic() - killed < 30
    firing = wait_until(lambda: [a for a in prom.alerts()
                                 if a["labels"]["alertname"] == "GpuwatchEngineDown"
                                 and a["state"] == "firing" and a["labels"]["engine"] == name],
                        420, interval=5, what="the shipped GpuwatchEngineDown to fire")
    assert firing[0]["labels"]["severity"] == "critical"
    assert time.monotonic() - killed >= 290  # its `for: 5m`, past the old 2-minute forgetting
    state = d.state()
    assert state["signals"]["engines"][name]["up"] is False
    assert [e for e in state["active_events"]
            if e["signal"] == "engine_down" and e["engine"] == name]
