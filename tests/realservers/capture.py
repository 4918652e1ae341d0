"""Captures a real server's exposition idle, under a bounded load and after it, as fixtures.

    python -m tests.realservers.capture {vllm,triton,llamacpp} [OUTDIR]

Each file's first line names the server, its version and this command.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.realservers import build, servers
from tests.realservers.client import OpenAIClient

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
VERSIONS = {"vllm": build.VLLM, "triton": build.PYTRITON,
            "llamacpp": f"llama.cpp from llama-cpp-python=={build.LLAMA_CPP_PYTHON}"}
NAMES = {"vllm": "vllm-0.32.0-cpu", "triton": "triton-2.51-pytriton-0.7.0",
         "llamacpp": "llamacpp-0.3.36"}


# A scrape counts as "under load" once it shows this much going on.
BUSY = {
    "vllm": lambda t: _value(t, "vllm:num_requests_waiting{") > 0,
    "llamacpp": lambda t: _value(t, "llamacpp:requests_deferred ") > 0,
    "triton": lambda t: _value(t, 'nv_inference_request_success{model="scale"') > 0,
}


def _value(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def busiest(s: servers.Server, load: servers.Background, busy) -> str:
    """The first scrape that shows the load, polled while it runs (bounded)."""
    deadline = time.monotonic() + 60
    text = s.metrics()
    while not busy(text) and load._t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
        text = s.metrics()
    return text


def capture(kind: str, out: Path) -> list[Path]:
    work = Path(tempfile.mkdtemp(prefix=f"capture-{kind}-"))
    if kind == "vllm":
        s = servers.Vllm(work)
        load = servers.Background(servers.completions, s.base,
                                  [f"{i} hello world the gpu watch" for i in range(24)],
                                  threads=8, max_tokens=96)
    elif kind == "llamacpp":
        s = servers.LlamaServer(work)
        load = servers.Background(servers.completions, s.base, ["hello world"] * 30,
                                  threads=6, max_tokens=128)
    else:
        s = servers.Triton(work)
        load = None
    try:
        idle = s.metrics()
        if kind == "triton":
            load = servers.Background(servers.triton_infer, s.base, 500, threads=8)
        during = busiest(s, load, BUSY[kind])
        load.join()
        time.sleep(1.5)
        after = s.metrics()
        phases = [("idle", idle), ("load", during), ("after", after)]
        if kind == "vllm":
            # what its HTTP layer counts and its engine does not: refused and abandoned requests
            OpenAIClient(s.base, "tiny-llama").mix(ok=6, bad=6, abort=4, max_tokens=8)
            time.sleep(1.5)
            phases.append(("client", s.metrics()))
    finally:
        s.stop(timeout=30)
    cmd = f"python -m tests.realservers.capture {kind}"
    paths = []
    for phase, text in phases:
        p = out / f"{NAMES[kind]}-real-{phase}.prom"
        p.write_text(f"# Captured from a real {VERSIONS[kind]} server, {phase}: `{cmd}`\n"
                     + text)
        paths.append(p)
    return paths


if __name__ == "__main__":
    kind = sys.argv[1]
    for p in capture(kind, Path(sys.argv[2]) if len(sys.argv) > 2 else OUT):
        print(p)
