"""The I/O side: scraping real HTTP servers on loopback, URLs, discovery."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

from gpuwatch.engines import discovery
from gpuwatch.engines.config import DiscoveryConfig, EngineConfig
from gpuwatch.engines.urls import engine_from_url, engines_from_urls, normalize_url
from gpuwatch.exposition import compact, read
from gpuwatch.sources.engines import EngineSource, engines_from_flags, redact, scrape

VLLM = (Path(__file__).parent / "fixtures" / "engines" / "vllm-0.33.0-statlogger.prom").read_text()


async def serve(handlers: dict) -> tuple[web.AppRunner, int]:
    app = web.Application()
    for path, handler in handlers.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, port


async def run_source(handlers: dict, configs, seconds: float, until=None) -> list:
    """Serve handlers and scrape them with one EngineSource (configs(port)) for a while (or
    until until(samples), at most `seconds`)."""
    runner, port = await serve(handlers)
    samples = []
    src = EngineSource(configs(port), DiscoveryConfig())
    task = asyncio.create_task(src.run(samples.append))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline and not (until and until(samples)):
        await asyncio.sleep(0.1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await runner.cleanup()
    return samples


def cfg(port: int, path: str = "/metrics", **kw) -> EngineConfig:
    return EngineConfig(name=f"e{path.replace('/', '-')}", url=f"http://127.0.0.1:{port}{path}",
                        **kw)


async def scrape_once(handlers: dict, path: str = "/metrics", **kw):
    from gpuwatch.sources.engines import session_for

    runner, port = await serve(handlers)
    try:
        c = cfg(port, path, **kw)
        async with session_for(c) as session:
            return await scrape(session, c, pids=[7])
    finally:
        await runner.cleanup()


def test_scrape_accepts_any_content_type_and_records_everything():
    async def h(request):
        return web.Response(body=VLLM.encode(), content_type="application/octet-stream")

    s = asyncio.run(scrape_once({"/metrics": h}))
    # kept as what gpuwatch reads of it, which reads exactly like the whole scrape
    assert s.error is None and s.exposition == compact(VLLM)
    assert read(s.exposition) == read(VLLM)
    assert s.kind == "auto" and s.pids == [7] and s.t > 1e9 and s.duration_seconds >= 0


def test_scrape_sends_token_and_headers_and_asks_for_text():
    seen = {}

    async def h(request):
        seen.update(request.headers)
        return web.Response(text="vllm:num_requests_running 1\n")

    s = asyncio.run(scrape_once({"/metrics": h}, bearer_token="s3cret",
                                headers={"X-Tenant": "a"}))
    assert s.error is None
    assert seen["Authorization"] == "Bearer s3cret" and seen["X-Tenant"] == "a"
    assert seen["Accept"].startswith("text/plain")


def test_scrape_decompresses_gzip():
    async def h(request):
        return web.Response(body=gzip.compress(VLLM.encode()),
                            headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})

    assert asyncio.run(scrape_once({"/metrics": h})).exposition == compact(VLLM)


@pytest.mark.parametrize("chunked", [False, True])
def test_scrape_refuses_a_body_over_the_cap(chunked):
    async def h(request):
        if not chunked:
            return web.Response(body=b"x" * 300_000)
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(40):
            await resp.write(b"y" * 10_000)
        await resp.write_eof()
        return resp

    s = asyncio.run(scrape_once({"/metrics": h}, max_body_bytes=100_000))
    assert s.exposition is None and "100000-byte limit" in s.error


def test_scrape_errors_are_samples():
    async def boom(request):
        return web.Response(status=503, text="engine dead")

    s = asyncio.run(scrape_once({"/metrics": boom}))
    assert s.exposition is None and s.error == "HTTP 503 Service Unavailable"
    s = asyncio.run(scrape_once({"/other": boom}))
    assert s.error == "HTTP 404 Not Found"


def test_connection_refused():
    async def go():
        import aiohttp

        c = EngineConfig(name="x", url="http://127.0.0.1:1/metrics", timeout_seconds=2)
        async with aiohttp.ClientSession() as session:
            return await scrape(session, c)

    s = asyncio.run(go())
    assert s.error.startswith("connection failed")


def test_a_slow_endpoint_delays_nobody():
    """One endpoint answers after 3 s (timeout 0.4 s), another at once: both keep pace."""

    async def slow(request):
        await asyncio.sleep(3)
        return web.Response(text=VLLM)

    async def fast(request):
        return web.Response(text=VLLM)

    samples = asyncio.run(run_source(
        {"/slow": slow, "/fast": fast},
        lambda port: [cfg(port, "/slow", interval_seconds=0.5, timeout_seconds=0.4),
                      cfg(port, "/fast", interval_seconds=0.2, timeout_seconds=0.4)], 1.6))
    slow_s = [s for s in samples if s.name == "e-slow"]
    fast_s = [s for s in samples if s.name == "e-fast"]
    assert len(fast_s) >= 6 and all(s.error is None for s in fast_s)
    assert len(slow_s) >= 3
    assert all("within 0.4s" in s.error for s in slow_s)


def test_urls_from_flags():
    assert normalize_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert normalize_url("https://h/") == "https://h/metrics"
    assert normalize_url("http://h:9/custom?x=1") == "http://h:9/custom?x=1"
    e = engine_from_url("localhost:30000")
    assert (e.name, e.kind, e.url) == ("localhost:30000", "auto", "http://localhost:30000/metrics")
    assert engine_from_url("http://[::1]:8000").name == "[::1]:8000"
    names = [e.name for e in engines_from_flags(["h:1", "http://h:1/metrics", "h:2"])]
    assert names == ["h:1", "h:1-2", "h:2"]
    assert [e.name for e in engines_from_urls(["h:1"], taken={"h:1"})] == ["h:1-2"]
    with pytest.raises(ValueError, match="--engine 'ftp://x'"):
        engine_from_url("ftp://x")
    with pytest.raises(ValueError, match=r"(?i)port"):
        engine_from_url("h:99999")


def test_redact_drops_credentials():
    assert redact("http://u:p@h:1/metrics") == "http://h:1/metrics"
    assert redact("http://h:1/metrics") == "http://h:1/metrics"


@pytest.mark.parametrize(("argv", "expected"), [
    (["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m", "--port", "8001"],
     ("vllm", "http://127.0.0.1:8001/metrics")),
    (["vllm", "serve", "m"], ("vllm", "http://127.0.0.1:8000/metrics")),
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--host=0.0.0.0", "--port=9000",
      "--ssl-keyfile", "k", "--ssl-certfile", "c"], ("vllm", "https://127.0.0.1:9000/metrics")),
    (["vllm", "serve", "m", "--uds", "/tmp/s"], None),
    (["python3", "-m", "sglang.launch_server", "--model-path", "m", "--enable-metrics"],
     ("sglang", "http://127.0.0.1:30000/metrics")),
    (["python3", "-m", "sglang.launch_server", "--model-path", "m"], None),  # no metrics
    (["text-generation-launcher", "--model-id", "m", "-p", "8080"],
     ("tgi", "http://127.0.0.1:8080/metrics")),
    (["/usr/local/bin/text-generation-launcher", "--prometheus-port", "9001"],
     ("tgi", "http://127.0.0.1:9001/metrics")),
    (["./llama-server", "-m", "x.gguf", "--metrics", "--host", "10.0.0.5", "--port", "8081"],
     ("llamacpp", "http://10.0.0.5:8081/metrics")),
    (["llama-server", "-m", "x.gguf"], None),
    (["tritonserver", "--model-repository=/m"], ("triton", "http://127.0.0.1:8002/metrics")),
    (["tritonserver", "--metrics-port", "9002", "--http-address", "::1"],
     ("triton", "http://[::1]:9002/metrics")),
    (["tritonserver", "--allow-metrics=false"], None),
    (["python3", "train.py", "--port", "8000"], None),
    ([], None),
])
def test_engine_command_lines(argv, expected):
    assert discovery.match_cmdline(argv) == expected


def test_scan_finds_a_real_engine_process_and_its_children():
    code = ("import subprocess, time; "
            f"c = subprocess.Popen([{sys.executable!r}, '-c', 'import time; time.sleep(30)']); "
            "time.sleep(30)")
    proc = subprocess.Popen(["bash", "-c", f'exec -a llama-server {sys.executable} -c "{code}" '
                             "--metrics --port 45678"])
    try:
        deadline = time.monotonic() + 10
        found = []
        while time.monotonic() < deadline:
            found = [f for f in discovery.scan(("llamacpp",)) if proc.pid in f.pids]
            if found and len(found[0].pids) >= 2:
                break
            time.sleep(0.2)
        assert found, "the engine process was not discovered"
        assert found[0].url == "http://127.0.0.1:45678/metrics"
        assert found[0].name == "llamacpp-45678"
        assert len(found[0].pids) >= 2  # the child counts: it is what NVML would list
    finally:
        for child in __import__("psutil").Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


def test_discovery_attaches_pids_and_starts_and_stops_engines():
    async def go():
        configured = EngineConfig(name="mine", url="http://localhost:8000/metrics")
        src = EngineSource([configured], DiscoveryConfig(enabled=True, expect_gone_seconds=60))
        clock = [1000.0]
        src.monotonic = lambda: clock[0]
        found = [discovery.Found("vllm", "http://127.0.0.1:8000/metrics", [10, 11]),
                 discovery.Found("sglang", "http://127.0.0.1:39999/metrics", [20])]
        src.apply_discovery(found, lambda s: None)
        pids = dict(src.pids)
        started = sorted(src._tasks)
        # its process is gone: still scraped (down) for as long as it was expected
        src.apply_discovery([], lambda s: None)
        clock[0] += 59
        src.apply_discovery([], lambda s: None)
        kept = sorted(src._tasks)
        clock[0] += 1
        src.apply_discovery([], lambda s: None)
        await asyncio.sleep(0)
        left = sorted(src._tasks)
        return pids, started, kept, left

    pids, started, kept, left = asyncio.run(go())
    assert pids == {"mine": [10, 11], "sglang-39999": [20]}
    assert started == ["sglang-39999"] and kept == ["sglang-39999"] and left == []


def test_a_discovered_engine_that_comes_back_is_the_same_engine():
    async def go():
        src = EngineSource([], DiscoveryConfig(enabled=True))
        vllm = discovery.Found("vllm", "http://127.0.0.1:8000/metrics", [10])
        src.apply_discovery([vllm], lambda s: None)
        task = src._tasks["vllm-8000"]
        src.apply_discovery([], lambda s: None)  # crashed
        assert "vllm-8000" in src._gone_since
        src.apply_discovery([discovery.Found("vllm", vllm.url, [30])], lambda s: None)
        same = src._tasks["vllm-8000"] is task and not src._gone_since
        for t in src._tasks.values():
            t.cancel()
        return same, dict(src.pids)

    same, pids = asyncio.run(go())
    assert same and pids == {"vllm-8000": [30]}


def test_tritons_version_comes_from_its_http_port():
    argv = ["tritonserver", "--model-repository", "/m", "--http-port", "8010",
            "--metrics-port", "8012"]
    assert discovery.info_url("triton", argv) == "http://127.0.0.1:8010/v2"
    assert discovery.info_url("triton", [*argv, "--allow-http=false"]) == ""
    assert discovery.info_url("vllm", ["vllm", "serve"]) == ""


def test_configured_local_engines_get_the_listening_process_pids():
    """Without discovery, a configured engine on this host is linked to the process that
    listens on its port (here: this test process) and its children."""

    async def h(request):
        return web.Response(text=VLLM)

    samples = asyncio.run(run_source(
        {"/metrics": h}, lambda port: [cfg(port, interval_seconds=0.2)], 1.5))
    assert samples and samples[-1].error is None
    assert os.getpid() in samples[-1].pids


def test_no_redirect_to_another_host_and_no_header_sent_there():
    """Two real servers on loopback (another port is another host): the engine redirects
    to the other one, which must see neither the token nor the custom header, and whose
    body must not be taken as the engine's."""
    other_seen = []

    async def other(request):
        other_seen.append(dict(request.headers))
        return web.Response(text=VLLM)

    async def go():
        other_runner, other_port = await serve({"/metrics": other})

        async def redirect(request):
            raise web.HTTPFound(f"http://127.0.0.1:{other_port}/metrics")

        try:
            return await scrape_once({"/metrics": redirect}, bearer_token="t0ken-1",
                                     headers={"X-Api-Key": "k3y-2"})
        finally:
            await other_runner.cleanup()

    for _ in range(5):
        s = asyncio.run(go())
        assert s.exposition is None and "redirected to another host" in s.error
        assert "t0ken-1" not in s.error and "k3y-2" not in s.error
    assert other_seen == []


def test_a_redirect_on_the_same_host_is_followed_with_the_headers():
    seen = {}

    async def moved(request):
        raise web.HTTPMovedPermanently("/real")

    async def real(request):
        seen.update(request.headers)
        return web.Response(text=VLLM)

    s = asyncio.run(scrape_once({"/metrics": moved, "/real": real}, headers={"X-Api-Key": "k"}))
    assert s.error is None and s.exposition == compact(VLLM)
    assert seen["X-Api-Key"] == "k"

    async def loop(request):
        raise web.HTTPFound("/metrics")

    s = asyncio.run(scrape_once({"/metrics": loop}))
    assert s.error == "more than 3 redirects"


def test_a_gzip_bomb_is_refused_at_the_cap():
    bomb = gzip.compress(b"\n" * (64 * 2**20), compresslevel=9)  # 64 MiB of newlines

    async def h(request):
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip"})

    assert len(bomb) < 200_000
    s = asyncio.run(scrape_once({"/metrics": h}, max_body_bytes=2**20))
    assert s.exposition is None and "decompressed response is over the 1048576" in s.error


def test_an_unrecognised_body_keeps_only_a_short_excerpt():
    async def h(request):
        return web.Response(text="hello there " * 200_000)  # 2.4 MB of prose

    s = asyncio.run(scrape_once({"/metrics": h}))
    assert s.exposition is None and "it starts with 'hello there hello" in s.error
    assert len(s.error) < 400


def test_reading_a_huge_body_does_not_block_the_event_loop():
    """15 MB of valid exposition: the loop keeps ticking while it is read."""
    lines = [f'vllm:num_requests_running{{engine="{i}",model_name="{"m" * 100}"}} 1'
             for i in range(110_000)]
    body = ("\n".join(lines) + "\n").encode()
    assert len(body) > 14_000_000

    async def h(request):
        return web.Response(body=body)

    async def go():
        lags = []

        async def ticker():
            loop = asyncio.get_running_loop()
            while True:
                t = loop.time()
                await asyncio.sleep(0.005)
                lags.append(loop.time() - t - 0.005)

        task = asyncio.create_task(ticker())
        s = await scrape_once({"/metrics": h}, max_body_bytes=32 * 2**20)
        task.cancel()
        return s, lags

    s, lags = asyncio.run(go())
    assert s.error is None and s.reading[0].ranks > 0
    # Read on the loop, this body stalled it for 1.5 s (2-core VM); what is left is the
    # loop's own share of moving 15 MB (and of a busy machine).
    assert max(lags) < 0.5, f"the loop stalled {max(lags):.3f}s"


def test_what_the_source_read_off_the_loop_equals_what_replay_reads():
    """The live analyzer uses the reading the source attached; replay reads the recorded
    text again: same states."""
    import msgspec

    from gpuwatch.model import EngineSample, Tick
    from gpuwatch.signals.conditions import Conditions
    from gpuwatch.signals.derived import Derived
    from gpuwatch.signals.engine import EngineAnalyzer

    async def h(request):
        return web.Response(text=VLLM)

    s = asyncio.run(scrape_once({"/metrics": h}))
    assert s.reading is not None
    recorded = msgspec.json.decode(msgspec.json.encode(s), type=EngineSample)
    assert getattr(recorded, "reading", None) is None  # never written to the recording
    states = []
    for sample in (s, recorded):
        derived = Derived()
        EngineAnalyzer().update(Tick(t=1.0, engines=[sample]), derived, Conditions())
        states.append(derived.engines[s.name])
    assert states[0] == states[1] and states[0].up


async def slowloris(request):
    """A byte every 0.2 s, for 4 s."""
    resp = web.StreamResponse()
    await resp.prepare(request)
    with contextlib.suppress(ConnectionError, RuntimeError):  # the client gives up
        for _ in range(20):
            await resp.write(b"v")
            await asyncio.sleep(0.2)
    return resp


def test_huge_garbage_and_stalling_endpoints_do_not_make_a_healthy_one_late():
    huge = ("".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n'
                    for i in range(250_000))).encode()  # ~15 MB of valid lines
    junk = os.urandom(2 * 2**20)

    async def big(request):
        return web.Response(body=huge)

    async def garbage(request):
        return web.Response(body=junk)

    async def fast(request):
        return web.Response(text=VLLM)

    paths = ("/big1", "/big2", "/garbage", "/slowloris", "/fast")
    samples = asyncio.run(run_source(
        dict(zip(paths, (big, big, garbage, slowloris, fast), strict=True)),
        lambda port: [cfg(port, p, interval_seconds=0.3, timeout_seconds=1.0) for p in paths],
        120, until=lambda got: {x.name for x in got} >= {f"e{p.replace('/', '-')}" for p in paths}
        and sum(x.name == "e-fast" for x in got) >= 4))
    fast_s = [s for s in samples if s.name == "e-fast"]
    # never an error; its bodies may wait for a reader behind the 15 MB ones (how long:
    # benchmarks/hostile_input_cost.py)
    assert fast_s and [s.error for s in fast_s if s.error] == []
    by_name = {s.name: s for s in samples}
    big1 = by_name["e-big1"]
    assert big1.error is None and big1.reading[0].ranks == 20_000  # max_series lines read
    assert "binary response" in by_name["e-garbage"].error
    assert "within 1s" in by_name["e-slowloris"].error


def test_the_version_comes_from_the_engines_info_endpoint_bounded():
    calls = []

    async def metrics(request):
        return web.Response(text=VLLM)

    async def version(request):
        calls.append(request.headers.get("Authorization"))
        return web.json_response({"version": "0.33.0\x1b[31m"})

    samples = asyncio.run(run_source(
        {"/metrics": metrics, "/version": version},
        lambda port: [cfg(port, interval_seconds=0.2, bearer_token="tok")], 5.0))
    assert len(samples) >= 2 and samples[-1].info == {"version": "0.33.0[31m"}  # no ESC
    assert calls and set(calls) == {"Bearer tok"}  # the endpoint's own session
    assert len(calls) == 1  # once while it stays up, not on every scrape


def test_info_answers_that_are_not_what_was_asked_are_no_info():
    from gpuwatch.sources import engine_info as info

    props = {"build_info": "b6100-1a2b", "model_path": "/models/tiny-llama.gguf",
             "total_slots": 2}
    assert info.parse("llamacpp", json_bytes(props)) == {"version": "b6100-1a2b",
                                                         "model": "tiny-llama.gguf"}
    assert info.parse("llamacpp", json_bytes({**props, "model_alias": "tiny"}))["model"] == "tiny"
    assert info.parse("llamacpp", json_bytes({**props, "model_alias": "/m/a.gguf"}))[
        "model"] == "a.gguf"  # the alias defaults to the path
    assert info.parse("tgi", json_bytes({"version": "3.0.1", "model_id": "org/m"})) == {
        "version": "3.0.1", "model": "org/m"}
    for body in (b"<html>", b"[1, 2]", b"[" * 100000, json_bytes({"version": {"x": 1}}),
                 json_bytes({"version": True})):
        assert info.parse("vllm", body) == {}
    assert len(info.parse("vllm", json_bytes({"version": "9" * 10000}))["version"]) == 64
    assert info.url_for("triton", "http://h:8002/metrics") is None
    assert info.url_for("vllm", "https://h:8000/metrics?x=1") == "https://h:8000/version"


def json_bytes(doc) -> bytes:
    import json

    return json.dumps(doc).encode()
