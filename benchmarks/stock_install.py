"""Prove the README's two commands on a stock Debian 12 (bookworm), not on this machine's Python.

Builds (or reuses) a debootstrap root of bookworm, copies the working tree into it, and runs,
under chroot, as root:

1. the README's run command, until the daemon answers 200 on /readyz;
2. docs/deployment.md's install block, as written (it ends in `gpuwatch check`);
3. the README's test command: the whole suite (`--tests PATHS` limits it), with its cache of
   real servers and Debian's Prometheus tools inside the root, as on a new machine. The units
   the command's packages enable and the processes left running in the root are logged.

The commands are read from the documents, never retyped here. The Debian mirror is the one apt
on this machine is configured with (/etc/apt/sources.list*), so nothing names a host. The
bootstrapped root is cached as a tarball keyed by the suite, debootstrap's version and the UTC
date (a new day gets a fresh archive state).

    sudo python3 benchmarks/stock_install.py --log benchmarks/results/stock-install-bookworm.log

Needs root, debootstrap, tar, and the Debian archive and PyPI reachable. The whole suite takes
40-60 minutes on two cores (a cold cache of real servers is about 12 of them); not part of CI.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = "bookworm"
# Ubuntu 24.04 with --suite noble --mirror URL: Debian 12's debootstrap has no script of that
# name (every Ubuntu release uses this one) and Debian no Ubuntu keyring, so the Release file
# is not verified there: the log says so.
UBUNTU = {"noble": "/usr/share/debootstrap/scripts/gutsy"}
# The install, CLI and deployment tests (--tests subset): a quick pass of the same commands.
SUBSET = ("tests/test_readme.py tests/test_cli_errors.py tests/test_cli_check_config.py "
          "tests/test_deploy_files.py tests/test_startup_log.py tests/test_exit_statuses.py "
          "tests/test_docs_deployment.py")
# The run command's daemon listens here, given by GPUWATCH_LISTEN: the command stays as written.
PORT = 19471


def readme_commands() -> tuple[str, str]:
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return blocks[0].strip(), blocks[1].strip()


def deployment_install_block() -> str:
    doc = (ROOT / "docs" / "deployment.md").read_text()
    install = doc.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", install, re.S)[0].strip()


def enabled_units(root: Path) -> set[str]:
    """What starts at boot: systemd's .wants links and SysV start links."""
    found = {str(p.relative_to(root)) for p in root.glob("etc/systemd/system/*.wants/*")}
    found |= {str(p.relative_to(root)) for p in root.glob("etc/rc[2-5].d/S*")}
    return found


def apt_mirror() -> str:
    """The first plain Debian archive URI apt is configured with (not the security one)."""
    texts = [Path(p).read_text() for p in ["/etc/apt/sources.list",
                                           *sorted(glob.glob("/etc/apt/sources.list.d/*"))]
             if os.path.isfile(p)]
    for text in texts:
        for m in re.finditer(r"^URIs:\s*(\S+)|^deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, re.M):
            uri = m[1] or m[2]
            if "/debian" in uri and "security" not in uri:
                return uri
    raise SystemExit("no Debian mirror found in /etc/apt/sources.list*")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "gpuwatch" / "stock-install"


def debootstrap_version() -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "debootstrap"],
                         capture_output=True, text=True, check=True).stdout
    return re.sub(r"[^A-Za-z0-9.+-]", "_", out)


def log(fh, msg: str) -> None:
    line = f"[{dt.datetime.now(dt.UTC).strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    fh.write(line + "\n")
    fh.flush()


def run_logged(fh, argv: list[str], timeout: float, env: dict | None = None,
               shown: list[str] | None = None) -> int:
    log(fh, "$ " + " ".join(shown or argv))
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    assert proc.stdout is not None
    try:
        for raw in proc.stdout:
            fh.write(raw.decode(errors="replace"))
        rc = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    fh.flush()
    log(fh, f"exit status {rc} after {time.monotonic() - t0:.0f} s")
    return rc


def bootstrap(fh, target: Path, suite: str = SUITE, mirror: str | None = None) -> None:
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    today = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
    tarball = cache / f"{suite}-debootstrap{debootstrap_version()}-{today}.tar"
    if not tarball.exists():
        fresh = target.parent / "fresh"
        argv = ["debootstrap", "--variant=minbase"]
        if suite in UBUNTU and not Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg"
                                        ).exists():
            argv.append("--no-check-gpg")
        argv += [suite, str(fresh)]
        script = [UBUNTU[suite]] if suite in UBUNTU else []
        # The mirror stays out of the log: it is this machine's apt configuration.
        rc = run_logged(fh, [*argv, mirror or apt_mirror(), *script], 1800,
                        shown=[*argv, "<mirror>", *script])
        if rc:
            raise SystemExit(f"debootstrap failed ({rc})")
        tmp = tarball.with_suffix(".part")
        subprocess.run(["tar", "-C", str(fresh), "-cf", str(tmp), "."], check=True)
        tmp.rename(tarball)
        shutil.rmtree(fresh)
    log(fh, f"root from {tarball.name}")
    target.mkdir()
    subprocess.run(["tar", "-C", str(target), "-xf", str(tarball)], check=True)


@contextlib.contextmanager
def mounted(root: Path):
    done: list[Path] = []
    try:
        for src, opts in (("/proc", ["-t", "proc", "proc"]), ("/sys", ["--rbind", "/sys"]),
                          ("/dev", ["--rbind", "/dev"])):
            dst = root / src.lstrip("/")
            subprocess.run(["mount", *opts, str(dst)], check=True)
            done.append(dst)
        yield
    finally:
        for dst in reversed(done):
            subprocess.run(["umount", "-R", str(dst)], check=False)


def stop_leftovers(root: Path) -> list[tuple[int, str]]:
    """Stop processes still running inside the root (a service a package started, a daemon a
    failed test left), by pid; their pids and names."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "root").startswith(str(root)):
                    found.append((int(entry.name), (entry / "comm").read_text().strip()))
    for pid, _ in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found


def still_mounted(work: Path) -> list[str]:
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(str(work))]


def copy_tree(dst: Path) -> None:
    """Tracked and untracked-but-not-ignored files: what a clone plus local edits holds."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)


HOSTS = "127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n"
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"
CHROOT_CA = "/etc/ssl/certs/outer-network-ca.crt"


def chroot_argv(root: Path, command: str, cwd: str = "/root/gpuwatch",
                extra: tuple[str, ...] = ()) -> list[str]:
    # A login-like, clean environment: what a root shell on a fresh Debian 12 has. The only
    # thing taken from the outer machine is its CA bundle, for networks that intercept TLS
    # (pip reads PIP_CERT); on an open network it changes nothing.
    ca = [f"PIP_CERT={CHROOT_CA}"] if (root / CHROOT_CA.lstrip("/")).exists() else []
    return ["env", "-i", "HOME=/root", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
            "/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive", "LANG=C.UTF-8",
            *extra, *ca, "chroot", str(root),
            "/bin/sh", "-c", f"cd {cwd} && {command}"]


def wait_ready(timeout: float, proc: subprocess.Popen) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), urllib.request.urlopen(
                f"http://127.0.0.1:{PORT}/readyz", timeout=2) as r:
            if r.status == 200:
                return True
        time.sleep(2)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", default=str(ROOT / "benchmarks/results/stock-install-bookworm.log"))
    ap.add_argument("--tests", default="",
                    help=f"test paths appended to the README's pytest (default: none, the "
                         f"whole suite; the install and CLI subset: {SUBSET})")
    ap.add_argument("--keep", action="store_true", help="keep the chroot for inspection")
    ap.add_argument("--suite", default=SUITE, help=f"{SUITE}, or noble with --mirror")
    ap.add_argument("--mirror", help="the archive to bootstrap from (default: apt's Debian)")
    ap.add_argument("--bootstrap-only", action="store_true", help="only fill the cache")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (debootstrap, chroot, mount)")
    # SIGTERM unwinds like Ctrl-C, so the bind mounts are released before anything is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_cmd, test_cmd = readme_commands()
    if args.tests:
        test_cmd = f"{test_cmd} -p no:cacheprovider {args.tests}"
    work = Path(tempfile.mkdtemp(prefix="gpuwatch-stock-"))
    root = work / "root"
    results: dict[str, str] = {}
    with open(args.log, "w") as fh:
        log(fh, f"stock install check: {args.suite} (debootstrap minbase), as root")
        try:
            bootstrap(fh, root, args.suite, args.mirror)
            if args.bootstrap_only:
                return 0
            shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
            # What Debian's installer writes and debootstrap does not: without it `localhost`
            # does not resolve (chromedriver's clients connect to it).
            if not (root / "etc/hosts").exists():
                (root / "etc/hosts").write_text(HOSTS)
            if os.path.exists(HOST_CA):
                (root / CHROOT_CA.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(HOST_CA, root / CHROOT_CA.lstrip("/"))
            copy_tree(root / "root/gpuwatch")
            with mounted(root):
                log(fh, "python in the root: " + subprocess.run(
                    ["chroot", str(root), "sh", "-c", "command -v python3 || echo none"],
                    capture_output=True, text=True).stdout.strip())
                log(fh, f"RUN command (README): {run_cmd}")
                listen = (f"GPUWATCH_LISTEN=127.0.0.1:{PORT}",)
                daemon = subprocess.Popen(chroot_argv(root, run_cmd, extra=listen), stdout=fh,
                                          stderr=subprocess.STDOUT, start_new_session=True)
                ok = wait_ready(1200, daemon)
                if daemon.poll() is None:
                    # sh -c ... && gpuwatch run: the daemon is sh's child, in its group.
                    os.killpg(daemon.pid, signal.SIGTERM)
                daemon.wait(timeout=60)
                fh.flush()
                results["run"] = "ok: /readyz answered 200" if ok else "FAILED"
                log(fh, f"run command: {results['run']}; daemon exit {daemon.returncode}")
                block = deployment_install_block()
                log(fh, "INSTALL block (docs/deployment.md):\n" + block)
                rc = run_logged(fh, chroot_argv(root, f"bash -e -c {shlex.quote(block)}",
                                                extra=listen), 1200)
                results["deployment"] = "ok" if rc == 0 else f"FAILED (exit {rc})"
                before = enabled_units(root)
                log(fh, f"TEST command (README): {test_cmd}")
                rc = run_logged(fh, chroot_argv(root, test_cmd), 5400)
                results["test"] = "ok" if rc == 0 else f"FAILED (exit {rc})"
                added = sorted(enabled_units(root) - before)
                log(fh, "units the test command enabled: " + (", ".join(added) or "none"))
                left = stop_leftovers(root)
                log(fh, "processes it left running in the root: " + (
                    ", ".join(f"{pid} {name}" for pid, name in left) or "none"))
                if left:
                    time.sleep(1)
        finally:
            # Never remove a tree that still has the host's /dev or /sys bound inside it.
            left = still_mounted(work)
            if left:
                log(fh, f"still mounted, {work} left in place: {left}")
            elif not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        log(fh, f"RESULT run: {results.get('run', 'not reached')}; "
            f"deployment install block: {results.get('deployment', 'not reached')}; "
            f"test: {results.get('test', 'not reached')}")
    return 0 if results.get("run", "").startswith("ok") and results.get("test") == "ok" and \
        results.get("deployment") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
