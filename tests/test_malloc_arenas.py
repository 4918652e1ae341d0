"""The daemon caps glibc's malloc arenas before its threads start: threads that allocate
then share arenas instead of each keeping its own resident heap."""

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import os, sys, threading
    from gpuwatch.lifecycle import fewer_malloc_arenas
    if sys.argv[1] == "capped":
        print("capped", fewer_malloc_arenas(), flush=True)
    def work():
        keep = [bytearray(4096 + i) for i in range(2000)]  # malloc, not Python's pools
        done.wait()
    done = threading.Event()
    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    # every arena but the main one is a heap aligned on 64 MiB, most of it unreadable
    heaps = 0
    for line in open("/proc/self/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if line.split()[1] == "---p" and (hi - lo) > 32 << 20 and len(line.split()) == 5:
            heaps += 1
    print("heaps", heaps, flush=True)
    done.set()
""")


def _heaps(mode: str, env: dict | None = None) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                         timeout=60, env=env, check=True).stdout.split("\n")
    capped = next((line for line in out if line.startswith("capped")), "")
    heaps = int(next(line for line in out if line.startswith("heaps")).split()[1])
    return capped, heaps


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas")
def test_threads_share_arenas_once_capped():
    _, free = _heaps("free")
    capped, heaps = _heaps("capped")
    assert capped == "capped True"
    assert free >= 4  # each allocating thread took one of its own
    assert heaps <= 1  # the cap of 2: the main arena and one more


def test_an_operators_setting_wins(monkeypatch):
    import os

    from gpuwatch.lifecycle import fewer_malloc_arenas

    monkeypatch.setitem(os.environ, "MALLOC_ARENA_MAX", "8")
    assert fewer_malloc_arenas() is False


TRIM_CHILD = textwrap.dedent("""
    import sys
    from gpuwatch.lifecycle import trim_heap
    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    junk = [bytearray(2048) for _ in range(20000)]  # 40 MiB of malloc, not Python's pools
    pin = bytearray(2048)  # above the junk: glibc cannot give it back from the top
    del junk
    before = rss()
    trimmed = trim_heap() if sys.argv[1] == "trim" else None
    print(trimmed, (before - rss()) >> 20, flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
@pytest.mark.parametrize("mode", ["trim", "keep"])
def test_trimming_gives_the_freed_heap_back(mode):
    """What was freed below the heap's top stays resident until the daemon trims."""
    out = subprocess.run([sys.executable, "-c", TRIM_CHILD, mode], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    if mode == "trim":
        assert out[0] == "True" and int(out[1]) >= 30
    else:
        assert int(out[1]) < 5
