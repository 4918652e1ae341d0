"""A load client that records its own truth: what it sent, what each request was answered,
the tokens it got, the time each took, and the requests it walked away from.

The real-server tests compare what gpuwatch reports with these counts. Loopback only,
bounded in requests and in wall time.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

MAX_REQUESTS = 600
MAX_SECONDS = 180.0


@dataclass
class Truth:
    """What the client saw, request by request."""

    statuses: Counter = field(default_factory=Counter)  # HTTP status (0: no answer)
    aborted: int = 0  # requests the client left before the answer ended
    completion_tokens: int = 0  # as the answers' usage said
    prompt_tokens: int = 0
    seconds: list[float] = field(default_factory=list)  # end to end, answered requests
    # llama.cpp's per-request timings, summed: decoding and prompt milliseconds and tokens
    timings: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def sent(self) -> int:
        return sum(self.statuses.values()) + self.aborted

    @property
    def errors(self) -> int:
        """Requests answered with an error status: what a client counts as failed."""
        return sum(n for s, n in self.statuses.items() if s >= 400 or s == 0)

    def error_ratio(self) -> float:
        return self.errors / self.sent if self.sent else 0.0

    def add(self, status: int, seconds: float, usage: dict | None = None,
            timings: dict | None = None) -> None:
        with self.lock:
            self.statuses[status] += 1
            if 200 <= status < 300:
                self.seconds.append(seconds)
            if usage:
                self.completion_tokens += int(usage.get("completion_tokens") or 0)
                self.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            for k in ("predicted_ms", "predicted_n", "prompt_ms", "prompt_n"):
                self.timings[k] += float((timings or {}).get(k) or 0)

    def add_abort(self) -> None:
        with self.lock:
            self.aborted += 1


def interleave(counts: dict[str, int]) -> list[str]:
    """Kinds spread evenly through the plan, so that every window sees each of them."""
    total = sum(counts.values())
    items = [((i + 0.5) / n, kind) for kind, n in counts.items() for i in range(n)]
    return [kind for _, kind in sorted(items)] if total else []


class OpenAIClient:
    """Normal, bad and abandoned completions against an OpenAI-compatible server."""

    def __init__(self, base: str, model: str, truth: Truth | None = None) -> None:
        assert base.startswith("http://127.0.0.1:"), "loopback only"
        self.base = base
        self.model = model
        self.truth = truth or Truth()
        self.port = int(base.rsplit(":", 1)[1])

    def _post(self, body: dict | bytes, timeout: float = 60.0) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.base + "/v1/completions", data=data,
                                     headers={"Content-Type": "application/json"})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                data = json.loads(r.read() or b"{}")
                self.truth.add(r.status, time.monotonic() - t0, data.get("usage"),
                               data.get("timings"))
        except urllib.error.HTTPError as e:
            e.read()
            self.truth.add(e.code, time.monotonic() - t0)
        except OSError:
            self.truth.add(0, time.monotonic() - t0)

    def ok(self, prompt: str = "hello world", max_tokens: int = 16) -> None:
        self._post({"model": self.model, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True, "n_predict": max_tokens})

    def bad(self, i: int) -> None:
        """A request the server should refuse: an unknown model, an invalid parameter, a body
        that is not JSON (the one llama.cpp refuses too)."""
        if i % 3 == 0:
            self._post({"model": "no-such-model", "prompt": "x", "max_tokens": 4})
        elif i % 3 == 1:
            self._post({"model": self.model, "prompt": "x", "max_tokens": -1})
        else:
            self._post(b'{"model": "x", "prompt": ')

    def abort(self, after_bytes: int = 1) -> None:
        """A streamed completion the client walks away from after its first bytes."""
        body = json.dumps({"model": self.model, "prompt": "hello world", "max_tokens": 200,
                           "stream": True, "ignore_eos": True, "n_predict": 200}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
                s.sendall(head.encode() + body)
                s.recv(max(after_bytes, 1))
        except OSError:
            pass
        self.truth.add_abort()

    def mix(self, ok: int, bad: int, abort: int, threads: int = 3,
            max_tokens: int = 16, stop: threading.Event | None = None) -> Truth:
        """ok normal, bad refused and abort abandoned requests, interleaved."""
        plan = interleave({"ok": ok, "bad": bad, "abort": abort})[:MAX_REQUESTS]
        deadline = time.monotonic() + MAX_SECONDS

        def one(item: tuple[int, str]) -> None:
            i, kind = item
            if time.monotonic() > deadline or (stop is not None and stop.is_set()):
                return
            if kind == "ok":
                self.ok(f"{i} hello world the gpu watch", max_tokens)
            elif kind == "bad":
                self.bad(i)
            else:
                self.abort()

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, enumerate(plan)))
        return self.truth


class TritonClient:
    """Inferences against the test Triton's models (tests/realservers/triton_server.py):
    `scale` always answers, `echo_text` fails (BACKEND) on the input "fail"."""

    def __init__(self, base: str, truth: Truth | None = None) -> None:
        assert base.startswith("http://127.0.0.1:"), "loopback only"
        self.base = base
        self.truth = truth or Truth()
        self.by_model: Counter = Counter()  # (model, status) -> n

    def _post(self, model: str, body: dict) -> int:
        req = urllib.request.Request(f"{self.base}/v2/models/{model}/infer",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            e.read()
            status = e.code
        except OSError:
            status = 0
        self.truth.add(status, time.monotonic() - t0)
        with self.truth.lock:
            self.by_model[(model, status)] += 1
        return status

    def scale(self) -> int:
        return self._post("scale", {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                                "data": [1.0, 2.0, 3.0, 4.0]}]})

    def echo(self, text: str) -> int:
        return self._post("echo_text", {"inputs": [{"name": "text", "shape": [1],
                                                    "datatype": "BYTES", "data": [text]}]})

    def steady(self, per_second: float, seconds: float, stop: threading.Event | None = None):
        """scale inferences at a steady rate, one at a time (a paced open loop)."""
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < min(seconds, MAX_SECONDS):
            if stop is not None and stop.is_set():
                break
            self.scale()
            n += 1
            pause = start + n / per_second - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        return n
