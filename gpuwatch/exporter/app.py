"""The daemon's HTTP application: /metrics, /healthz, /readyz, /api/state and the status page."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import msgspec

from gpuwatch.exporter import server
from gpuwatch.exporter.metric import CONTENT_TYPE
from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.snapshot import Snapshot
from gpuwatch.exporter.state_json import state_document
from gpuwatch.views.page import status_page

if TYPE_CHECKING:  # only a daemon with a web configuration file loads it
    from gpuwatch.webconfig import Guard

_json = msgspec.json.Encoder()


def readiness(snap: Snapshot) -> tuple[bool, str]:
    """Ready = every source was tried once and the latest tick did not fail; the body lists
    the degraded sources. A GPU host whose NVML is down stays ready (its engines and probes
    still serve) unless require_gpu is set, for DaemonSets that must not count a pod
    without its GPUs."""
    ticks = snap.extras.get("ticks") or {}
    if ticks.get("consecutive_failures"):
        return False, (f"not ready: the last {ticks['consecutive_failures']} ticks failed "
                       f"({ticks.get('last_error') or '?'})\n")
    if not snap.ready:
        return False, "not ready: waiting for the first complete sample\n"
    degraded = sorted(f"{name}: {st.reason or 'down'}" for name, st in snap.sources.items()
                      if not st.up and (st.reason or st.errors_total))
    if getattr(snap.config, "require_gpu", False) and not (snap.tick and snap.tick.gpus):
        nvml = snap.sources.get("nvml")
        why = nvml.reason if nvml and nvml.reason else "no GPU found"
        return False, f"not ready: no GPU sampled and --require-gpu is set ({why})\n"
    return True, "ready\n" + "".join(f"degraded {d}\n" for d in degraded)


def make_app(get_snapshot: Callable[[], Snapshot], renderer: Renderer | None = None,
             extra_routes: Iterable[server.Route] = (), *,
             guard: Guard | None = None) -> server.App:
    """renderer: shared with the daemon, which renders new states ahead of the expected
    scrape, so a scrape only copies bytes. guard: basic auth and headers on every route, as
    a middleware, so routes added later are covered too."""
    renderer = renderer or Renderer()

    async def metrics(request: server.Request) -> server.Response:
        body = renderer.serve(get_snapshot())
        return server.Response(body, content_type=CONTENT_TYPE)

    async def healthz(request: server.Request) -> server.Response:
        return server.Response("ok\n")

    async def readyz(request: server.Request) -> server.Response:
        ok, text = readiness(get_snapshot())
        return server.Response(text, 200 if ok else 503)

    async def api_state(request: server.Request) -> server.Response:
        snap = get_snapshot()
        if snap.config is not None and not snap.config.http.api_state:
            return server.Response("/api/state is off ([http] api_state = false)\n", 404)
        body = _json.encode(state_document(snap))
        return server.Response(body, content_type="application/json")

    app = server.App(middlewares=[guard.middleware] if guard is not None else [])
    app.add_routes([
        server.get("/metrics", metrics),
        server.get("/healthz", healthz),
        server.get("/readyz", readyz),
        server.get("/api/state", api_state),
        server.get("/", status_page),
        *extra_routes,
    ])
    return app
