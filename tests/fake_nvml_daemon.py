"""Runs the real daemon (`python -m tests.fake_nvml_daemon run ...`) over one fake GPU whose
process list is read from the file FAKE_NVML_PIDS_FILE on every sample: one `PID [USED
BYTES]` per line (default 2 GiB). They are real processes of the host, found on the "GPU"
as NVML would list them: their names, users and cgroups are the real ones."""

from __future__ import annotations

import os
import sys

from tests.fake_nvml import GIB, FakeGpu, FakeNvml, proc


class _Patch:
    """What FakeNvml.install needs of pytest's monkeypatch, without importing pytest into
    the daemon (benchmarks measure this process's memory)."""

    def setattr(self, target, name, value) -> None:
        setattr(target, name, value)


class FileGpu(FakeGpu):
    @property
    def processes(self):
        out = []
        try:
            with open(os.environ["FAKE_NVML_PIDS_FILE"]) as f:
                for line in f:
                    pid, *used = line.split()
                    out.append(proc(int(pid), int(used[0]) if used else 2 * GIB))
        except (OSError, ValueError, IndexError):
            pass
        return out

    @processes.setter
    def processes(self, value):
        pass


def main() -> None:
    FakeNvml([FileGpu(0)]).install(_Patch())
    from gpuwatch import serve

    if serve.SPEC in os.environ:  # the daemon's own process, after `run`'s exec
        serve.main()
    serve.MODULE = __spec__.name
    from gpuwatch.cli import main as cli

    sys.argv[0] = "gpuwatch"
    cli()


if __name__ == "__main__":
    main()
