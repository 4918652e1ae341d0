"""asyncio, imported without ssl until something imports ssl.

asyncio's event-loop modules import ssl as they load: OpenSSL and the ssl module, about
4 MiB of the daemon's resident memory, although a daemon with no TLS configured never uses
them. Importing this module first (the command line does, as
`from gpuwatch.lean_asyncio import asyncio`) imports asyncio with ssl held
back, and watches for the first `import ssl` anywhere later (a web configuration with TLS,
an https engine or API client): that import hands ssl back to asyncio's modules, which then
work as if it had been there from the start.

Where asyncio or ssl is already imported, this does nothing.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys

# asyncio's modules that read a module-level `ssl` (None when it was missing at import)
_USERS = ("asyncio.base_events", "asyncio.selector_events")


def _give_back(ssl_module) -> None:
    for name in _USERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "ssl", None) is None:
            module.ssl = ssl_module
    sslproto = sys.modules.get("asyncio.sslproto")
    if sslproto is not None and sslproto.ssl is None:
        # re-run as if ssl had been there: it also derives module constants from ssl
        importlib.reload(sslproto)


class _Loader:  # a loader, not importlib.abc's: that imports importlib.resources
    def __init__(self, inner, watch) -> None:
        self.inner = inner
        self.watch = watch

    def __getattr__(self, name):  # get_source, get_filename...: the file loader's own
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _give_back(module)
        if self.watch in sys.meta_path:  # once: ssl is in sys.modules from now on
            sys.meta_path.remove(self.watch)


class _Watch:  # a meta path finder
    def find_spec(self, name, path=None, target=None):
        # a spec asked for without an import (importlib.util.find_spec) keeps the watch
        if name != "ssl" or "ssl" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self)
        return spec


def _import() -> None:
    if "asyncio" in sys.modules or "ssl" in sys.modules:
        return
    sys.modules["ssl"] = None  # `import ssl` raises ImportError: asyncio's modules allow it
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]
    sys.meta_path.insert(0, _Watch())


_import()

import asyncio  # noqa: E402

__all__ = ["asyncio"]
