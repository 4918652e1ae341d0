"""Fixtures that start real processes; each is stopped when the test ends."""

from __future__ import annotations

import os

import pytest

from tests import helpers
from tests.realservers import build

_TOOLS: list[str] = []


def pytest_configure(config):
    """Prometheus, promtool, Alertmanager and amtool: Debian's, on PATH for every test and
    child (fetched once into the cache where they are not installed)."""
    try:
        where = build.tool_dir()
    except (build.Unavailable, RuntimeError, OSError) as exc:
        _TOOLS.append(f"prometheus tools: not available ({exc})")
        return
    if where:
        os.environ["PATH"] = where + os.pathsep + os.environ.get("PATH", "")
    _TOOLS.append(f"prometheus tools: {where or 'installed (PATH)'}")


def pytest_report_header(config):
    return _TOOLS


def _factory(request, tmp_path, cls):
    started: list[helpers.Proc] = []

    def start(*args, **kwargs):
        proc = cls(tmp_path, *args, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()
        if getattr(request.node, "rep_call_failed", False):
            print(f"--- {proc.log_path.name} ---\n{proc.output()[-4000:]}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.rep_call_failed = report.failed
    return report


@pytest.fixture
def daemon(request, tmp_path):
    """start(*cli_args, config_toml=None, env=None) -> helpers.Daemon (ready)."""
    yield from _factory(request, tmp_path, helpers.Daemon)


@pytest.fixture
def procs():
    """Processes of other uids for the local-user attack tests (tests/hostile_users.py),
    killed at the end."""
    from tests.hostile_users import Procs

    p = Procs()
    yield p
    p.close()


@pytest.fixture
def probe_dir():
    """A probe directory every user may reach, for daemons run as root by the local-user
    attack tests: what the daemon mounts in it is unmounted at the end."""
    from tests.hostile_users import remove_shared, shared_dir

    d = shared_dir()
    yield f"{d}/probe"
    remove_shared(d)


@pytest.fixture
def prometheus(request, tmp_path):
    """start(targets, scrape_interval="1s", rule_files=(), alertmanager_url=None)."""
    yield from _factory(request, tmp_path, helpers.Prometheus)


@pytest.fixture
def alertmanager(request, tmp_path):
    """start(config_yaml) -> helpers.Alertmanager."""
    yield from _factory(request, tmp_path, helpers.Alertmanager)


def _gpu_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return n > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU/driver on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def shared_tmp():
    """A fresh directory processes of other uids can reach (tmp_path is root's, 0700)."""
    import subprocess

    from tests.other_uids import shared_dir

    path = shared_dir()
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
def sleepers():
    """start(uid, probe_dir, samples=None) -> a live process of uid with its probe record
    (tests/other_uids.py); stopped when the test ends."""
    from tests.other_uids import Sleepers

    started = Sleepers()
    yield started
    started.stop()
