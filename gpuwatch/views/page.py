"""The status page at `/`: one static HTML file (inline CSS and JS, no external assets) that
renders /api/state in the browser, so serving it costs the daemon only a copy of bytes."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from gpuwatch.exporter import server


@cache
def page_bytes() -> bytes:
    # a file beside the module: importlib.resources would cost the daemon ~2 MiB of modules
    return (Path(__file__).parent / "status.html").read_bytes()


async def status_page(request: server.Request) -> server.Response:
    # no-cache: a daemon upgrade serves the new page on the next load
    return server.Response(page_bytes(), content_type="text/html; charset=utf-8",
                           headers={"Cache-Control": "no-cache"})
