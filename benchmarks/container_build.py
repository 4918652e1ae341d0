"""Build exporters/Containerfile here, without a Docker engine or a registry, and start it.

    sudo python3 -m benchmarks.container_build [--log benchmarks/results/container-build.log]

The base is Debian 12 made by debootstrap from Debian's archive (benchmarks/stock_install.py's
cached root, imported as an image): what `debian:bookworm-slim` is, without a registry to pull
it from. buildah builds the Containerfile as written (vfs storage, chroot isolation: no
daemon, no user namespaces), with `--build-arg BASE=` naming that image. Then, in a container
of the built image: `gpuwatch --version`, and `gpuwatch run --simulate mixed` answering
/readyz on loopback, started the way the image's ENTRYPOINT starts it.

Needs root, buildah, podman (to import the base), debootstrap, and Debian's archive and PyPI.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks import stock_install

ROOT = Path(__file__).resolve().parent.parent
STORAGE = ["--storage-driver", "vfs"]
BASE = "localhost/debootstrap-bookworm:minbase"
PORT = 19473


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            with contextlib.suppress(OSError):
                kids = [int(k) for k in (task / "children").read_text().split()]
                out += kids
                todo += kids
    return out


def version() -> str:
    return re.search(r'__version__ = "([^"]+)"', (ROOT / "gpuwatch/__init__.py").read_text())[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", default=str(ROOT / "benchmarks/results/container-build.log"))
    args = ap.parse_args()
    tag = f"localhost/gpuwatch:{version()}"
    with open(args.log, "w") as fh, tempfile.TemporaryDirectory() as tmp:
        stock_install.log(fh, "container image: exporters/Containerfile, buildah (vfs, chroot)")
        rootfs = Path(tmp) / "root"
        stock_install.bootstrap(fh, rootfs)  # the cached debootstrap root, as a tarball
        tarball = Path(tmp) / "base.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
        rc = stock_install.run_logged(fh, ["podman", *STORAGE, "import", str(tarball), BASE],
                                      600)
        if rc:
            return rc
        # The only thing taken from this machine: its CA bundle, for a network that intercepts
        # TLS, mounted for the build's RUN steps with a pip.conf naming it (nothing of it stays
        # in the image; on an open network it changes nothing).
        mounts = []
        if Path(stock_install.HOST_CA).exists():
            conf = Path(tmp) / "pip.conf"
            conf.write_text(f"[global]\ncert = {stock_install.CHROOT_CA}\n")
            mounts = ["-v", f"{stock_install.HOST_CA}:{stock_install.CHROOT_CA}:ro",
                      "-v", f"{conf}:/etc/pip.conf:ro"]
        t0 = time.monotonic()
        rc = stock_install.run_logged(fh, [
            "buildah", *STORAGE, "bud", "--isolation", "chroot", *mounts,
            "--build-arg", f"BASE={BASE}", "-f", "exporters/Containerfile", "-t", tag, "."],
            3600)
        stock_install.log(fh, f"build: exit {rc} after {time.monotonic() - t0:.0f} s")
        if rc:
            return rc
        out = subprocess.run(["buildah", *STORAGE, "inspect", "--type", "image", "--format",
                              "{{.OCIv1.Config.Entrypoint}} {{.OCIv1.Config.Cmd}} "
                              "{{.OCIv1.Config.Volumes}} size {{.OCIv1.Config.Labels}}", tag],
                             capture_output=True, text=True)
        stock_install.log(fh, f"image {tag}: {out.stdout.strip()}")
        ctr = subprocess.run(["buildah", *STORAGE, "from", tag], capture_output=True,
                             text=True, check=True).stdout.strip()
        run = ["buildah", *STORAGE, "run", "--isolation", "chroot", ctr, "--"]
        try:
            rc = stock_install.run_logged(fh, [*run, "gpuwatch", "--version"], 120)
            daemon = subprocess.Popen([*run, "gpuwatch", "run", "--simulate", "mixed",
                                       "--listen", f"127.0.0.1:{PORT}"], stdout=fh,
                                      stderr=subprocess.STDOUT)
            ready = False
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and daemon.poll() is None and not ready:
                with contextlib.suppress(OSError), urllib.request.urlopen(
                        f"http://127.0.0.1:{PORT}/readyz", timeout=2) as r:
                    ready = r.status == 200
                time.sleep(1)
            # SIGTERM to gpuwatch itself, as a container runtime stops it. buildah's chroot
            # runner reports its child killed even then: its status is logged, not judged.
            for pid in descendants(daemon.pid):
                with contextlib.suppress(OSError):
                    if b"/bin/gpuwatch\x00run\x00" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        os.kill(pid, signal.SIGTERM)
            daemon.wait(60)
            stock_install.log(fh, f"gpuwatch run in the image: /readyz "
                              f"{'200' if ready else 'never 200'}; after SIGTERM, exit "
                              f"{daemon.returncode}")
        finally:
            subprocess.run(["buildah", *STORAGE, "rm", ctr], capture_output=True)
        ok = rc == 0 and ready
        stock_install.log(fh, f"RESULT: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
