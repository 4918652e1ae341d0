"""Debian 13's VictoriaMetrics on loopback: the OTLP receiver the tests push to, answering
PromQL (tests/realservers/trixie.py fetches it)."""

from __future__ import annotations

import json
import os
import urllib.parse

import pytest

from tests.helpers import Proc, free_port, http_get, wait_until


class VictoriaMetrics:
    """Debian 13's victoria-metrics on loopback: OTLP in, PromQL out."""

    def __init__(self, workdir):
        from tests.realservers import trixie

        try:
            binary = str(trixie.victoria_metrics())
        except trixie.Unavailable as exc:
            if os.environ.get("CI") == "true":
                raise
            pytest.skip(f"Debian 13's VictoriaMetrics: {exc}")
        self.url = f"http://127.0.0.1:{free_port()}"
        d = workdir / "victoria-metrics"
        d.mkdir()
        # -search.latencyOffset=0: a sample is queryable as soon as it is flushed, not 30 s on
        self.proc = Proc([binary, f"-storageDataPath={d / 'data'}",
                          f"-httpListenAddr={self.url.removeprefix('http://')}",
                          "-opentelemetry.usePrometheusNaming", "-search.latencyOffset=0s",
                          "-search.disableCache", "-loggerLevel=WARN"], d, "victoria-metrics")
        wait_until(lambda: http_get(self.url + "/health", 1.0)[0] == 200, 30,
                   what="victoria-metrics ready")
        self.otlp = f"{self.url}/opentelemetry/v1/metrics"

    def api(self, path: str, **params):
        http_get(self.url + "/internal/force_flush", 5.0)
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        _, body = http_get(url, 10.0)
        data = json.loads(body)
        assert data.get("status") == "success", (path, params, data)
        return data["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        self.proc.stop()
