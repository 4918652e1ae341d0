"""Debian 13 (trixie) packages that Debian 12 lacks, fetched without changing the system: the
trixie suite of the Debian archive this machine's apt already uses, through a sources list,
package lists and state of its own; the .deb unpacked with dpkg-deb into the test cache
(cached by version, like the other real servers).

VictoriaMetrics 1.112 is the OTLP receiver the tests push to (its /opentelemetry/v1/metrics
speaks OTLP/HTTP protobuf and it answers PromQL). Debian builds Prometheus without its OTLP
receiver (2.53 in trixie, 3.5 in sid: "Disable OTLP Ingestion endpoint", Debian #1080354), and
no OpenTelemetry Collector is packaged. The static Go binary needs only libc and libzstd, which
Debian 12 has.

    python -m tests.realservers.trixie
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.realservers.build import Unavailable, _run, cache_dir, ensure

SUITE = "trixie"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def debian_archive() -> str:
    """The URI of the Debian archive apt is configured with (one-line or deb822 sources)."""
    files = [SOURCES[0]]
    if SOURCES[1].is_dir():
        files += [*sorted(SOURCES[1].glob("*.list")), *sorted(SOURCES[1].glob("*.sources"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        uris = re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.M)
        uris += [u for block in re.findall(r"^URIs:\s*(.+)$", text, re.M) for u in block.split()]
        for uri in uris:
            if uri.rstrip("/").endswith("/debian"):
                return uri.rstrip("/")
    raise Unavailable("apt has no Debian archive configured (a .../debian URI)")


def _apt(root: Path) -> list[str]:
    return ["-o", f"Dir::Etc::sourcelist={root / 'sources.list'}",
            "-o", f"Dir::State::Lists={root / 'lists'}", "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::Cache={root / 'cache'}", "-o", "Debug::NoLocking=1"]


def _candidate(root: Path, package: str) -> str:
    out = subprocess.run(["apt-cache", *_apt(root), "policy", package], capture_output=True,
                         text=True, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"}).stdout
    m = re.search(r"Candidate:\s*(\S+)", out)
    if not m or m[1] == "(none)":
        raise Unavailable(f"the {SUITE} lists name no {package}")
    return m[1]


def package(name: str, binary: str) -> Path:
    """usr/bin/<binary> of trixie's package <name>, from the cache (fetched the first time)."""
    cached = sorted(cache_dir().glob(f"{name}-{SUITE}-*/root/usr/bin/{binary}"))
    if cached:
        return cached[-1]
    if not shutil.which("apt-get"):
        raise Unavailable("no apt-get here")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for sub in ("lists/partial", "cache/archives/partial", "debs"):
            (root / sub).mkdir(parents=True)
        signed = f"[signed-by={KEYRING}] " if Path(KEYRING).exists() else ""
        (root / "sources.list").write_text(f"deb {signed}{debian_archive()} {SUITE} main\n")
        log = root / "apt.log"
        try:
            _run(["apt-get", *_apt(root), "update", "-q"], log)
        except RuntimeError as exc:
            raise Unavailable(f"apt-get update of {SUITE} failed: {exc}") from None
        version = _candidate(root, name)

        def fetch(where: Path) -> None:
            _run(["apt-get", *_apt(root), "download", "-q", f"{name}={version}"], log,
                 cwd=root / "debs")
            for deb in sorted((root / "debs").glob("*.deb")):
                _run(["dpkg-deb", "-x", str(deb), str(where / "root")], log)

        entry = f"{name}-{SUITE}-{version}".replace(":", "_")
        return ensure(entry, fetch) / "root" / "usr" / "bin" / binary


def victoria_metrics() -> Path:
    return package("victoria-metrics", "victoria-metrics")


if __name__ == "__main__":
    print(victoria_metrics())
