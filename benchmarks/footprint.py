"""Footprint side by side: gpuwatch and nvitop-exporter on the same GPUs, the same torch
processes, 1 s sampling, both scraped alike, in one run. RSS and USS (psutil
memory_full_info) through the window, CPU share of one core over it, and what importing each
costs, written as JSON.

    python -m benchmarks.footprint --out benchmarks/results/h200-footprint.json
    python -m benchmarks.footprint --simulate steady --out ...   # no GPU: gpuwatch alone

nvitop-exporter is found on PYTHONPATH (its wheels and nvitop's can be put there as .whl
files: both are pure Python) or unpacked from --wheels DIR. Without --no-load the benchmark
starts its own torch processes (3 by default, a few GiB each, with light churn). About 140 s
with the defaults (load start ~15 s, warm-up 15 s, window 90 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import psutil

from tests.helpers import free_port, http_get

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20

LOAD = textwrap.dedent("""
    import os, random, sys, time, torch
    gib, seconds = float(sys.argv[1]), float(sys.argv[2])
    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    held.fill_(1)
    torch.cuda.synchronize()
    print("ready", flush=True)
    rng, churn = random.Random(os.getpid()), []
    end = time.time() + seconds
    while time.time() < end:  # light churn: allocate, free, now and then give back
        # at most four pieces held: churn that comes back, not a random walk that climbs
        # for minutes (which gpuwatch rightly judges a leak, and acts on, in the window)
        if churn and (len(churn) >= 4 or rng.random() < 0.5):
            churn.pop()
        else:
            churn.append(torch.ones(rng.randint(64, 512) << 20, dtype=torch.uint8,
                                    device="cuda"))
        if rng.random() < 0.2:
            torch.cuda.empty_cache()
        held[: 1 << 26].float().sum().item()
        time.sleep(1.0)
""")

IMPORT_COST = textwrap.dedent("""
    import json, os, sys, psutil
    p = psutil.Process()
    before, n = p.memory_full_info(), len(sys.modules)
    import importlib
    importlib.import_module(sys.argv[1])
    after = p.memory_full_info()
    print(json.dumps({"module": sys.argv[1], "rss_mib": round(after.rss / 2**20, 1),
                      "uss_mib": round(after.uss / 2**20, 1),
                      "bare_rss_mib": round(before.rss / 2**20, 1),
                      "bare_uss_mib": round(before.uss / 2**20, 1),
                      "modules": len(sys.modules), "bare_modules": n,
                      "from_bytecode": round(sum(
                          1 for m in list(sys.modules.values())
                          if getattr(m, "__cached__", None) and os.path.exists(m.__cached__))
                          / max(1, sum(1 for m in list(sys.modules.values())
                                       if getattr(m, "__file__", None)
                                       and m.__file__.endswith(".py"))), 3)}))
""")

# pip compiles what it installs; a checkout or a --no-compile install has no bytecode, and
# every start then compiles source, which leaves the compiler's garbage in the heap (many
# MiB, on both sides). Both exporters are measured as installed.
PRECOMPILE = textwrap.dedent("""
    import compileall, importlib.util, os, sys
    for name in sys.argv[1:]:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        if spec.submodule_search_locations:
            compileall.compile_dir(os.path.dirname(spec.origin), quiet=2)
        else:
            compileall.compile_file(spec.origin, quiet=2)
""")
COMPILED = ("gpuwatch", "pynvml", "psutil", "msgspec", "h11", "click", "nvitop",
            "nvitop_exporter", "prometheus_client", "typing_extensions")


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        return http_get(url, timeout)
    except (OSError, ValueError):
        return 0, b""


def wait_for(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.25)
    raise SystemExit(f"footprint: timed out after {timeout:.0f} s waiting for {what}")


def child_env(extra_path: list[str], **extra: str) -> dict[str, str]:
    parts = [str(REPO), *extra_path, os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in parts if p), **extra}


def unpack_wheels(folder: str | None, into: Path) -> list[str]:
    """Every wheel in folder unpacked under into (importable from there); [] when none."""
    if not folder:
        return []
    wheels = sorted(Path(folder).glob("*.whl"))
    if not wheels:
        raise SystemExit(f"footprint: --wheels {folder}: no .whl files there")
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            z.extractall(into)
    return [str(into)]


def importable(module: str, env: dict[str, str]) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], env=env,
                          capture_output=True, timeout=60).returncode == 0


def import_cost(module: str, env: dict[str, str]) -> dict | None:
    res = subprocess.run([sys.executable, "-c", IMPORT_COST, module], env=env,
                         capture_output=True, text=True, timeout=120)
    return json.loads(res.stdout) if res.returncode == 0 else None


class Watched:
    """One exporter process: its memory through the window and its CPU over it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], url: str,
                 ready: str, log: Path) -> None:
        self.name, self.url, self.ready_path = name, url, ready
        self.log = open(log, "wb")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)
        self.memory: list[tuple[float, float, float]] = []  # t, rss, uss
        self.cpu0: tuple[float, float, float, float] | None = None
        self.cpu1: tuple[float, float, float, float] | None = None
        self.scrapes: list[int] = []
        self.maps: dict[str, int] = {}  # private KiB per mapping, at the window's end
        self.thread_names: list[str] = []

    def is_ready(self) -> bool:
        if self.proc.poll() is not None:
            raise SystemExit(f"footprint: {self.name} exited ({self.proc.returncode}); see "
                             f"{self.log.name}")
        return get(self.url + self.ready_path, 2.0)[0] == 200

    def _cpu(self) -> tuple[float, float, float, float]:
        own = self.ps.cpu_times()
        kids = 0.0
        for c in self.ps.children(recursive=True):
            try:
                t = c.cpu_times()
                kids += t.user + t.system
            except psutil.Error:
                pass
        return time.monotonic(), own.user + own.system, kids, self._schedstat()

    def _schedstat(self) -> float:
        """Seconds on a CPU of the threads alive now, in nanoseconds (the kernel's clock
        ticks above are 10 ms: 0.2 % of a core over 120 s is 24 of them)."""
        ns = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ns += int((task / "schedstat").read_text().split()[0])
        return ns / 1e9

    def start_window(self) -> None:
        self.cpu0 = self._cpu()

    def end_window(self) -> None:
        self.cpu1 = self._cpu()
        self.maps = self._private_by_mapping()
        self.thread_names = self._thread_names()

    def _private_by_mapping(self, top: int = 15) -> dict[str, int]:
        """Private KiB (clean and dirty) per mapped file, anonymous memory and heap: where
        a process's USS is."""
        out: dict[str, int] = {}
        name = "[anon]"
        try:
            with open(f"/proc/{self.proc.pid}/smaps") as fh:
                for line in fh:
                    head = line.split(maxsplit=6)
                    if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                        name = head[5].strip() if len(head) > 5 else "[anon]"
                    elif head[0] in ("Private_Clean:", "Private_Dirty:"):
                        out[name] = out.get(name, 0) + int(head[1])
        except OSError:
            return {}
        return dict(sorted(out.items(), key=lambda kv: -kv[1])[:top])

    def _thread_names(self) -> list[str]:
        names = []
        for tid in sorted(os.listdir(f"/proc/{self.proc.pid}/task")):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                names.append(Path(f"/proc/{self.proc.pid}/task/{tid}/comm").read_text().strip())
        return names

    def sample_memory(self) -> None:
        m = self.ps.memory_full_info()
        self.memory.append((time.monotonic(), m.rss / MIB, m.uss / MIB))

    def scrape(self) -> None:
        code, body = get(self.url + "/metrics", 10.0)
        self.scrapes.append(body.count(b"\n") if code == 200 else -1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()

    def result(self) -> dict:
        assert self.cpu0 and self.cpu1
        wall = self.cpu1[0] - self.cpu0[0]
        rss = [m[1] for m in self.memory]
        uss = [m[2] for m in self.memory]
        return {
            "pid": self.proc.pid,
            "rss_mib_end": round(rss[-1], 1), "rss_mib_max": round(max(rss), 1),
            "rss_mib_mean": round(sum(rss) / len(rss), 1),
            "uss_mib_end": round(uss[-1], 1), "uss_mib_max": round(max(uss), 1),
            "uss_mib_mean": round(sum(uss) / len(uss), 1),
            "cpu_share_of_a_core": round((self.cpu1[1] - self.cpu0[1]) / wall, 5),
            "cpu_share_schedstat": round((self.cpu1[3] - self.cpu0[3]) / wall, 6),
            "cpu_share_with_children": round(
                (self.cpu1[1] + self.cpu1[2] - self.cpu0[1] - self.cpu0[2]) / wall, 5),
            "window_seconds": round(wall, 1),
            "threads": self.ps.num_threads(),
            "thread_names": self.thread_names,
            "private_kib_by_mapping": self.maps,
            "exposition_lines": self.scrapes,
            "memory_samples": [[round(t - self.memory[0][0], 1), round(r, 1), round(u, 1)]
                               for t, r, u in self.memory],
        }


def start_load(n: int, gib: float, seconds: float, env: dict[str, str]) -> list:
    procs = [subprocess.Popen([sys.executable, "-c", LOAD, str(gib), str(seconds)],
                              env=env, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    deadline = time.monotonic() + 90
    for p in procs:
        line = ""
        # waited on with a deadline: a CUDA initialisation that hangs must not hang the run
        ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            line = p.stdout.readline()
        if not line.startswith("ready"):
            for q in procs:
                q.kill()
            raise SystemExit("footprint: a torch load process did not start (is torch with "
                             "CUDA installed?)")
    return procs


def gpu_names() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    res = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
    return [line.strip() for line in res.stdout.splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--window", type=float, default=90.0, help="seconds measured")
    ap.add_argument("--warmup", type=float, default=15.0, help="seconds before the window")
    ap.add_argument("--interval", type=float, default=1.0, help="both exporters' sampling")
    ap.add_argument("--scrape-every", type=float, default=15.0)
    ap.add_argument("--no-load", action="store_true", help="start no torch processes")
    ap.add_argument("--load-processes", type=int, default=3)
    ap.add_argument("--load-gib", type=float, default=3.0)
    ap.add_argument("--wheels", help="folder of wheels to unpack for nvitop-exporter")
    ap.add_argument("--simulate", help="gpuwatch on a simulated host, without the peer")
    ap.add_argument("--label", default="", help="a note kept in the JSON")
    args = ap.parse_args()

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp:
        tmpd = Path(tmp)
        extra = unpack_wheels(args.wheels, tmpd / "site")
        env = child_env(extra)
        peer = not args.simulate
        subprocess.run([sys.executable, "-c", PRECOMPILE, *COMPILED], env=env, timeout=600,
                       check=True)
        if peer and not importable("nvitop_exporter", env):
            raise SystemExit("footprint: nvitop_exporter is not importable: put its wheels "
                             "and nvitop's on PYTHONPATH or give --wheels DIR")
        out: dict = {
            "benchmark": "footprint", "label": args.label,
            "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "gpus": gpu_names(),
            "interval_seconds": args.interval, "scrape_every_seconds": args.scrape_every,
            "load": None if args.no_load or args.simulate else {
                "processes": args.load_processes, "gib_each": args.load_gib},
            "bytecode": "compiled before the run, as pip does at install",
            "imports": {"gpuwatch.daemon": import_cost("gpuwatch.daemon", env),
                        "gpuwatch.cli": import_cost("gpuwatch.cli", env)},
        }
        if peer:
            out["imports"]["nvitop_exporter.cli"] = import_cost("nvitop_exporter.cli", env)
        total = args.warmup + args.window
        load = [] if args.no_load or args.simulate else start_load(
            args.load_processes, args.load_gib, total + 60, env)
        watched: list[Watched] = []
        try:
            port = free_port()
            gw_args = [sys.executable, "-m", "gpuwatch", "run", "--listen", f"127.0.0.1:{port}"]
            if args.simulate:
                gw_args += ["--simulate", args.simulate]
            watched.append(Watched(
                "gpuwatch", gw_args,
                child_env(extra, STATE_DIRECTORY=str(tmpd / "state"),
                          GPUWATCH_NVML_FAST_INTERVAL_SECONDS=str(args.interval)),
                f"http://127.0.0.1:{port}", "/readyz", tmpd / "gpuwatch.log"))
            if peer:
                port = free_port()
                watched.append(Watched(
                    "nvitop-exporter",
                    [sys.executable, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1",
                     "--port", str(port), "--interval", str(args.interval)],
                    env, f"http://127.0.0.1:{port}", "/metrics", tmpd / "nvitop.log"))
            for w in watched:
                wait_for(w.is_ready, 60, f"{w.name} to serve")
            time.sleep(args.warmup)
            for w in watched:
                w.start_window()
            t0 = time.monotonic()
            next_scrape = t0
            while time.monotonic() - t0 < args.window:
                now = time.monotonic()
                if now >= next_scrape:
                    for w in watched:
                        w.scrape()
                    next_scrape += args.scrape_every
                for w in watched:
                    w.sample_memory()
                time.sleep(min(5.0, max(0.1, args.window - (time.monotonic() - t0))))
            for w in watched:
                w.end_window()
                w.sample_memory()
            out["exporters"] = {w.name: w.result() for w in watched}
        finally:
            for w in watched:
                w.stop()
            for p in load:
                p.kill()
                p.wait(10)
        logs = {w.name: (tmpd / ("gpuwatch.log" if w.name == "gpuwatch" else "nvitop.log"))
                .read_text(errors="replace")[-2000:] for w in watched}
    ex = out["exporters"]
    if "nvitop-exporter" in ex:
        g, n = ex["gpuwatch"], ex["nvitop-exporter"]
        out["gpuwatch_over_peer"] = {
            k: round(g[k] / n[k], 3) if n[k] else None
            for k in ("rss_mib_end", "uss_mib_end", "rss_mib_max", "uss_mib_max",
                      "cpu_share_of_a_core", "cpu_share_schedstat")}
    out["log_tails"] = logs
    out["seconds_total"] = round(time.monotonic() - started, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    summary = {k: out.get(k) for k in ("gpuwatch_over_peer", "seconds_total")}
    summary["exporters"] = {k: {m: v[m] for m in ("rss_mib_end", "uss_mib_end",
                                                  "cpu_share_of_a_core", "cpu_share_schedstat")}
                            for k, v in ex.items()}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
