"""The driver's process lists of one GPU (compute, graphics, MPS), read at the least cost.

On an H100, asked once a second, the compute list costs 0.13-0.36 ms of CPU in the driver with
three processes on the GPU, and an empty graphics or MPS list 0.04-0.23 ms: together about half
of the sampling thread's CPU. Two things make that less:

- **one driver call per list**: pynvml's wrapper asks the driver for the count, then for the
  list; here a buffer kept per list takes it in one call, and grows when the driver says it
  is too small;
- **a list found empty is asked again only every QUIET_RECHECK_SECONDS**: graphics and MPS
  lists are empty on most serving hosts. A list with processes in it is read every tick.
  The compute list is read every tick whatever it holds: it is where serving processes are.

Where the driver lacks the v3 entry points, pynvml's own wrappers serve (and their v2
fallback, see _Device.get).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pynvml

# An empty graphics or MPS list is asked again after this long: a process that only has a
# graphics context (or an MPS client) is seen within it, then followed every tick.
QUIET_RECHECK_SECONDS = 10.0
# The driver's count is trusted to grow a buffer only this far (entries of 24 bytes).
MAX_ENTRIES = 65536
_FIRST_ENTRIES = 16

# kind -> (C entry point, pynvml's wrapper, its v2 fallback)
KINDS = {
    kind: (f"nvmlDevice{fn}RunningProcesses_v3", f"nvmlDevice{fn}RunningProcesses",
           f"nvmlDevice{fn}RunningProcesses_v2")
    for kind, fn in (("compute", "GetCompute"), ("graphics", "GetGraphics"),
                     ("mps", "GetMPSCompute"))
}

Entry = tuple[int, int | None]  # (pid, used bytes; None where the driver cannot tell)


class ProcessList:
    """One list of one GPU: its C entry point (resolved once), its buffer, and when an empty
    list is due again."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.symbol, self.wrapper, self.v2 = KINDS[kind]
        self._fn: Callable | None = None
        self._direct = True  # False: the driver lacks the v3 entry point; the wrapper serves
        self._buf: ctypes.Array | None = None
        # the compute list is where serving processes are: read every tick, empty or not
        self.wait_when_empty = 0.0 if kind == "compute" else QUIET_RECHECK_SECONDS
        self.quiet_until = float("-inf")

    def due(self, now: float) -> bool:
        return now >= self.quiet_until

    def answered(self, entries: list[Entry] | None, now: float) -> None:
        """An empty list (or one that failed) waits; one with processes is read every tick."""
        self.quiet_until = now + self.wait_when_empty if not entries else float("-inf")

    def reader(self) -> Callable[..., list[Entry]]:
        """What _Device.get calls with the handle: the one-call read, or pynvml's wrapper
        where the driver has no v3 entry point."""
        if self._direct and self._fn is None:
            try:
                self._fn = pynvml._nvmlGetFunctionPointer(self.symbol)
            except pynvml.NVMLError:  # an older driver: its wrappers know what it has
                self._direct = False
        return self.read if self._direct else self._wrapped

    def _wrapped(self, handle) -> list[Entry]:
        return _entries(getattr(pynvml, self.wrapper)(handle))

    def read_v2(self, handle) -> list[Entry]:
        """pynvml's v2 wrapper: for a driver whose unversioned wrapper needs a symbol it
        lacks (NVMLLibraryMismatchError)."""
        return _entries(getattr(pynvml, self.v2)(handle))

    def read(self, handle) -> list[Entry]:
        """One call with the buffer kept; a larger buffer and once more when it was short
        (processes came since)."""
        fn = self._fn
        assert fn is not None
        for _ in range(3):
            if self._buf is None:
                self._buf = (pynvml.c_nvmlProcessInfo_v3_t * _FIRST_ENTRIES)()
            count = ctypes.c_uint(len(self._buf))
            ret = fn(handle, ctypes.byref(count), self._buf)
            if ret == pynvml.NVML_SUCCESS:
                na = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                return [(int(e.pid), None if e.usedGpuMemory == na else int(e.usedGpuMemory))
                        for e in self._buf[:min(count.value, len(self._buf))]]
            if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE or count.value > MAX_ENTRIES:
                raise pynvml.NVMLError(ret)
            self._buf = (pynvml.c_nvmlProcessInfo_v3_t * min(count.value * 2 + 5, MAX_ENTRIES))()
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)


def _entries(procs) -> list[Entry]:
    return [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
            for p in procs or ()]
