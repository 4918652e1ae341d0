"""The OOM flight recorder on a real GPU (skipped without one): real torch processes with the
probe run out of memory under the real daemon (NVML, 1 s ticks), in three patterns:

  * huge:  one request twice the GPU's size (full), then one over a per-process cap
           (limit), with allocation history recorded; the program catches both;
  * frag:  the GPU filled with segments refilled by 20 MiB blocks, every other one freed,
           then a 60 MiB request: over half the memory is free, in pieces (fragmentation);
  * leak:  a process that leaks about 1.5 GiB/s (the rate makes the wall about 90 s away)
           into the wall, uncaught: it dies of it, after the daemon flagged the leak.

Checked for each: one record (one event) per OOM, the request and free memory as torch wrote
them in its exception, the cause, the outcome, the event's ref (the leak's event, for the
leak), the probe's cost per OOM; the daemon's recording replayed gives the same events.

One scenario runs once for the module (about 2.5 minutes: the leak waits out the early
leak path's pause while the other two run); the tests then assert on what it left. Every
child is killed and waited for; nothing stays on the GPU. Set GPUWATCH_GPU_OUT to keep the
recording, the events, the report and the figures (h200-oom.*) in that directory.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import msgspec
import pytest

from gpuwatch.probe_channel.oom import OomRecord
from tests.fake_torch_oom import format_size as size
from tests.helpers import Daemon, child_env, wait_until

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(400)]

if importlib.util.find_spec("torch") is None:  # the children import it, this process never
    pytest.skip("torch is not installed", allow_module_level=True)

MIB = 1 << 20
GIB = 1 << 30
HOLD_SECONDS = 28  # the early leak path needs 20 s of flat memory after the first load
WALL_SECONDS = 90  # the leak rate is set so that the wall is this far

CHILD = textwrap.dedent(r"""
    import json, os, sys, time
    import torch
    MIB, GIB = 1 << 20, 1 << 30
    torch.cuda.init()
    torch.empty(1, device="cuda")
    import gpuwatch.probe as probe
    def say(what, **kw):
        print(json.dumps({"what": what, "t": time.time(), **kw}), flush=True)
    def cmd():
        return sys.stdin.readline().strip()
    def oom_text(exc):
        return str(exc).splitlines()[0]
    while probe.current() is None or probe.current().oom is None:
        time.sleep(0.02)  # the probe attaches torch's OOM observer once CUDA is up
    mode = sys.argv[1]
    say("ready", pid=os.getpid(), torch=torch.__version__, python=sys.version.split()[0])
    keep = []
    if mode == "huge":
        keep.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
        # allocation history: its cost per allocation, off and on
        def churn(n):
            t0 = time.perf_counter()
            for _ in range(n):
                x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
                del x
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / n
        churn(200)
        off = churn(2000)
        # Python stacks: C++ ones are symbolised when the snapshot is taken (seconds)
        torch.cuda.memory._record_memory_history("all", context="all", stacks="python",
                                                 max_entries=20000)
        on = churn(2000)
        say("history_cost", off_seconds=off, on_seconds=on)
        total = torch.cuda.mem_get_info()[1]
        try:
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as exc:
            say("oom", case="full", text=oom_text(exc))
        torch.cuda.memory._record_memory_history(None)
        time.sleep(2.5)  # past the burst: the next one is an OOM of its own
        torch.cuda.set_per_process_memory_fraction(0.02)
        try:
            torch.empty(10 * GIB, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as exc:
            say("oom", case="limit", text=oom_text(exc))
        time.sleep(2.5)
        # Near the cap with cached 20 MiB segments, a 30 MiB request: the allocator frees
        # cached blocks and retries. Whether torch calls its OOM observer on the way is
        # what this torch does; the record says "recovered" if it does.
        before = torch.cuda.memory_stats()["num_ooms"]
        cap = int(0.02 * total)
        cached = []
        while torch.cuda.memory_reserved() + 10 * MIB <= cap - 5 * MIB:
            cached.append(torch.empty(10 * MIB, dtype=torch.uint8, device="cuda"))
        del cached  # cached 10 MiB segments, 5-15 MiB under the cap
        try:
            x = torch.empty(30 * MIB, dtype=torch.uint8, device="cuda")
            del x
            raised = False
        except torch.cuda.OutOfMemoryError:
            raised = True
        say("retried", num_ooms_before=before, raised=raised,
            num_ooms_after=torch.cuda.memory_stats()["num_ooms"])
        torch.cuda.set_per_process_memory_fraction(1.0)
    elif mode == "frag":
        fill_ooms = 0
        blocks = []
        for size in (2048, 1024, 512, 256, 128, 64, 40):
            chunk = size * MIB
            while torch.cuda.mem_get_info()[0] >= chunk + 16 * MIB:
                try:
                    big = torch.empty(chunk, dtype=torch.uint8, device="cuda")
                except torch.cuda.OutOfMemoryError:
                    fill_ooms += 1  # the driver had less than it said: a smaller chunk
                    break
                del big  # its segment stays cached: refill it with 20 MiB blocks (no
                # earlier segment has a free block of 20 MiB: they are full, their tails
                # smaller)
                blocks += [torch.empty(20 * MIB, dtype=torch.uint8, device="cuda")
                           for _ in range(chunk // (20 * MIB))]
        # Every other block freed only now, once the GPU is full: had they been freed chunk
        # by chunk, the next chunk's blocks would fill those holes first (best fit) and
        # leave whole segments free, which a request then gets from the cache.
        keep += blocks[0::2]
        del blocks
        time.sleep(1.5)  # a fill OOM is a burst of its own
        free = torch.cuda.mem_get_info()[0]
        st = torch.cuda.memory_stats()
        say("filled", free=free, fill_ooms=fill_ooms, reserved=st["reserved_bytes.all.current"],
            allocated=st["allocated_bytes.all.current"])
        try:
            torch.empty(60 * MIB, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as exc:
            say("oom", case="fragmentation", text=oom_text(exc))
        keep.clear()
        torch.cuda.empty_cache()
    elif mode == "leak":
        assert cmd() == "go"
        for _ in range(4):  # a 2 GiB load, in bursts
            keep.append(torch.empty(512 * MIB, dtype=torch.uint8, device="cuda"))
            time.sleep(0.2)
        torch.cuda.synchronize()
        say("loaded")
        assert cmd() == "leak"
        free = torch.cuda.mem_get_info()[0]
        rate = min(2 * GIB, max(GIB // 2, free / float(sys.argv[2])))
        say("leak_start", rate=rate, free=free)
        t0, held = time.time(), 0
        while True:  # uncaught at the wall: the process dies of it
            while held < rate * (time.time() - t0):
                keep.append(torch.empty(256 * MIB, dtype=torch.uint8, device="cuda"))
                held += 256 * MIB
            time.sleep(0.02)
    say("done")
    cmd()
""")


class Child:
    """A torch process with the probe; start() returns at once, wait_ready() after."""

    def __init__(self, mode: str, workdir: Path, probe_dir: Path, *args: str) -> None:
        self.mode = mode
        env = child_env(GPUWATCH_PROBE_DIR=str(probe_dir), GPUWATCH_PROBE_INTERVAL_SECONDS="1")
        self.err_path = workdir / f"{mode}.stderr"
        self._err = open(self.err_path, "w")  # noqa: SIM115 - lives as long as the child
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, *args], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.said: list[dict] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.pid = self.proc.pid
        self.ready: dict = {}

    def wait_ready(self) -> None:
        self.ready = self.expect("ready", 120)
        assert self.ready["pid"] == self.pid

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def expect(self, what: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"{self.mode}: no {what!r} within {timeout}s; "
                                   f"said {self.said}; {self.stderr()[-2000:]}") from None
            if msg is None:
                raise RuntimeError(f"{self.mode} exited ({self.proc.wait()}) before {what!r}: "
                                   f"{self.stderr()[-3000:]}")
            self.said.append(msg)
            if msg["what"] == what:
                return msg

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        if not self._err.closed:
            self._err.flush()
        return self.err_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)
        if not self._err.closed:
            self._err.close()


def events_of(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.startswith("{")]


def ooms_of(events: list[dict], pid: int) -> list[dict]:
    return [e for e in events if e.get("signal") == "process_oom" and e.get("pid") == pid]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """Runs the three patterns once; yields what they left (and any error, for the tests)."""
    work = tmp_path_factory.mktemp("oom")
    out = Path(os.environ["GPUWATCH_GPU_OUT"]) if os.environ.get("GPUWATCH_GPU_OUT") else work
    out.mkdir(parents=True, exist_ok=True)
    probe_dir, snaps = work / "probe", work / "snapshots"
    rec, ev_path = work / "rec.jsonl", work / "events.jsonl"
    config = textwrap.dedent(f"""
        [probe]
        dir = "{probe_dir}"
        [remediation.snapshot]
        dir = "{snaps}"
    """)
    res: dict = {"work": work, "out": out, "events_path": ev_path, "recording": rec,
                 "snapshots": snaps, "children": {}, "error": None, "errors": {}}
    started = time.monotonic()
    daemon = Daemon(work, "--dry-run", "--record", str(rec), "--events-log", str(ev_path),
                    config_toml=config, env={"GPUWATCH_NVML_FAST_INTERVAL_SECONDS": "1"})
    children: list[Child] = []

    def spawn(mode: str, *args: str) -> Child:
        child = Child(mode, work, probe_dir, *args)
        children.append(child)
        res["children"][mode] = child
        return child

    def seen(pid: int) -> bool:
        sample = daemon.state().get("sample") or {}
        return any(p["pid"] == pid for g in sample.get("gpus", ())
                   for p in g.get("processes", ()))  # omitted when empty

    def adopted(pid: int, n: int) -> None:
        wait_until(lambda: len(ooms_of(events_of(ev_path), pid)) >= n, 30, 0.5,
                   f"{n} process_oom events of pid {pid}")

    def step(name: str, fn) -> None:
        """One part of the scenario; a failure is kept for the tests and the rest goes on."""
        try:
            fn()
        except Exception as exc:
            res["errors"][name] = f"{type(exc).__name__}: {exc}"

    def huge_case() -> None:
        retried = huge.expect("retried", 120)
        huge.expect("done", 30)
        # every record adopted (finished) before the process is killed
        adopted(huge.pid, 2 + (retried["num_ooms_after"] > retried["num_ooms_before"]))

    def frag_case() -> None:
        frag = spawn("frag")
        frag.wait_ready()
        filled = frag.expect("filled", 120)
        frag.expect("done", 60)
        adopted(frag.pid, 1 + filled["fill_ooms"])

    def leak_case() -> None:
        time.sleep(max(0.0, res["loaded"] + HOLD_SECONDS - time.time()))
        leak.send("leak")
        res["leak_start"] = leak.expect("leak_start", 10)
        leak.proc.wait(timeout=WALL_SECONDS + 90)  # it dies at the wall
        adopted(leak.pid, 1)
        time.sleep(2)  # one more tick into the recording

    try:
        leak = spawn("leak", str(WALL_SECONDS))
        huge = spawn("huge")  # both import torch at once
        leak.wait_ready()
        wait_until(lambda: seen(leak.pid), 30, 0.5, "the daemon to see the leaking process")
        leak.send("go")  # loaded after the daemon saw it small: a first load, then a pause
        res["loaded"] = leak.expect("loaded", 30)["t"]
        huge.wait_ready()
        step("huge", huge_case)
        huge.close()  # gone before the GPU is filled
        step("frag", frag_case)
        if "frag" in res["children"]:
            res["children"]["frag"].close()
        step("leak", leak_case)
    except Exception as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for child in children:
            child.close()
        daemon.stop()
        res["daemon_log"] = daemon.output()
        res["seconds"] = time.monotonic() - started
        if res["errors"]:
            res["error"] = f"{res.get('error') or ''} {res['errors']}"
    res["events"] = events_of(ev_path)
    yield res
    keep = {rec: "h200-oom.jsonl.gz", ev_path: "h200-oom.events.jsonl"}
    for src, name in keep.items():
        if src.exists() and out != work:
            if name.endswith(".gz"):
                with open(src, "rb") as f, gzip.open(out / name, "wb") as g:
                    shutil.copyfileobj(f, g)
            else:
                shutil.copy(src, out / name)


MESSAGE = re.compile(r"Tried to allocate (\S+ \S+)\. GPU \d+ has a total capacity of "
                     r"(\S+ \S+) of which (\S+ \S+) is free")


def _every_field(obj):
    if isinstance(obj, msgspec.Struct):
        return {f: _every_field(getattr(obj, f)) for f in obj.__struct_fields__}
    if isinstance(obj, list):
        return [_every_field(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _every_field(v) for k, v in obj.items()}
    return obj


def read_record(path: Path) -> dict:
    """The record as the daemon's own model reads it, defaults included (the file omits
    them)."""
    return _every_field(msgspec.json.decode(path.read_bytes(), type=OomRecord))


def check_against_torch(ev: dict, text: str) -> dict:
    m = MESSAGE.search(text)
    assert m, text
    record = read_record(Path(ev["oom"]["record"]))
    assert (size(record["request_bytes"]), size(record["device_free_bytes"])) == (
        m.group(1), m.group(3)), (record, text)
    assert size(record["device_total_bytes"]) == m.group(2)
    assert (ev["value"], ev["threshold"]) == (record["request_bytes"],
                                              record["device_free_bytes"])
    assert record["final"] and record["observer_calls"] >= 1
    return record


def child_said(res, mode: str, what: str) -> list[dict]:
    child = res["children"].get(mode)
    return [m for m in (child.said if child else []) if m["what"] == what]


def figures(res, **kw) -> None:
    path = res["out"] / "h200-oom-gpu.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(kw)
    path.write_text(json.dumps(data, indent=1, default=str))


def test_huge_request_and_per_process_cap_each_leave_one_record(scenario):
    huge = scenario["children"].get("huge")
    assert huge is not None, scenario["error"]
    said = {m["case"]: m for m in child_said(scenario, "huge", "oom")}
    assert set(said) == {"full", "limit"}, (said, scenario["error"])
    evs = ooms_of(scenario["events"], huge.pid)
    [retried] = child_said(scenario, "huge", "retried")
    third = retried["num_ooms_after"] > retried["num_ooms_before"]  # torch called the observer
    recovered_call = third and not retried["raised"]
    assert len(evs) == 2 + third, evs  # one per OOM
    full, limit = evs[0], evs[1]
    r_full = check_against_torch(full, said["full"]["text"])
    r_limit = check_against_torch(limit, said["limit"]["text"])
    assert full["oom"]["cause"] == "full" and limit["oom"]["cause"] == "limit"
    assert r_limit["allowed_bytes"] == int(0.02 * r_limit["device_total_bytes"]) or (
        abs(r_limit["allowed_bytes"] - 0.02 * r_limit["device_total_bytes"]) < MIB)
    py312 = sys.version_info >= (3, 12)
    assert full["oom"]["outcome"] == ("caught" if py312 else "unknown")
    assert full["severity"] == "critical" and not full["oom"].get("exited")
    # allocation history was on for the first: its pickle is beside it, for memory_viz
    import pickle

    snap = pickle.loads(Path(full["oom"]["history"]).read_bytes())
    actions = {e.get("action") for t in snap["device_traces"] for e in t}
    assert snap["segments"] and "oom" in actions, actions
    assert not r_limit["history"]
    if recovered_call:  # torch called its observer on a retry that then got the memory
        assert evs[2]["oom"]["outcome"] == "recovered" and evs[2]["severity"] == "warning"
    cost = child_said(scenario, "huge", "history_cost")
    figures(scenario, history_cost_per_alloc=cost[0] if cost else None,
            observer_on_recovered_retry=recovered_call,
            capture_seconds_full=r_full["capture_seconds"],
            capture_seconds_limit=r_limit["capture_seconds"],
            history_bytes=r_full["history_bytes"], torch=huge.ready["torch"],
            python=huge.ready["python"])


def test_fragmentation_is_told_apart_from_a_full_gpu(scenario):
    frag = scenario["children"].get("frag")
    assert frag is not None, scenario["error"]
    [filled] = child_said(scenario, "frag", "filled")
    [said] = child_said(scenario, "frag", "oom")
    evs = ooms_of(scenario["events"], frag.pid)
    assert len(evs) == 1 + filled["fill_ooms"], evs
    ev = evs[-1]
    record = check_against_torch(ev, said["text"])
    assert filled["free"] < 60 * MIB, filled  # the device alone could not serve it...
    s = record["summary"]
    assert s["free_bytes"] > 10 * GIB  # ...while far more was free in the allocator
    assert s["largest_free_block_bytes"] < 60 * MIB  # in pieces too small for it
    assert ev["oom"]["cause"] == "fragmentation", record
    assert ev["oom"]["fragmentation_ratio"] > 0.3
    figures(scenario, capture_seconds_fragmentation=record["capture_seconds"],
            fragmentation_segments=s["segments"], fragmentation_free_blocks=s["free_blocks"],
            fragmentation_record_bytes=len(Path(ev["oom"]["record"]).read_bytes()))


def test_a_leak_into_the_wall_was_predicted_and_its_oom_refers_to_it(scenario):
    leak = scenario["children"].get("leak")
    assert leak is not None and "leak_start" in scenario, scenario["error"]
    text = leak.stderr()
    assert "OutOfMemoryError" in text, text[-3000:]
    start = scenario["leak_start"]
    evs = ooms_of(scenario["events"], leak.pid)
    assert len(evs) == 1, evs
    ev = evs[0]
    record = check_against_torch(ev, text)
    assert ev["oom"]["cause"] == "full" and ev["oom"]["exited"]
    assert ev["oom"]["outcome"] == ("raised" if sys.version_info >= (3, 12) else "unknown")
    leaks = [e for e in scenario["events"] if e.get("signal") == "memory_leak"
             and e.get("pid") == leak.pid and e.get("state") == "firing"]
    assert leaks, "the leak was not flagged before the wall"
    first = leaks[0]
    assert first["t"] < record["t"]
    assert ev["ref"] == first["id"] and ev["oom"]["predicted_by"] == "memory_leak"
    assert ev["oom"]["lead_seconds"] == pytest.approx(ev["t"] - first["t"], abs=0.01)
    figures(scenario, leak_rate_bytes_per_second=start["rate"],
            leak_flagged_after_seconds=first["t"] - start["t"],
            oom_after_seconds=record["t"] - start["t"], lead_seconds=ev["oom"]["lead_seconds"],
            capture_seconds_leak=record["capture_seconds"], leak_segments=record["summary"][
                "segments"], scenario_seconds=scenario["seconds"])


def test_the_recording_replays_to_the_same_oom_events_and_reports_them(scenario):
    rec = scenario["recording"]
    assert rec.exists(), scenario["error"]
    live = [e for e in scenario["events"] if e.get("signal") == "process_oom"]
    assert len(live) >= 4, (live, scenario["error"])
    out = subprocess.run([sys.executable, "-m", "gpuwatch", "replay", str(rec), "--json"],
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert out.returncode == 0, out.stderr
    replayed = [json.loads(x) for x in out.stdout.splitlines()]
    assert [e for e in replayed if e.get("signal") == "process_oom"] == live
    html = scenario["out"] / "h200-oom-report.html"
    rep = subprocess.run([sys.executable, "-m", "gpuwatch", "report", str(rec), "-o", str(html)],
                         capture_output=True, text=True, timeout=120, env=child_env())
    assert rep.returncode == 0, rep.stderr
    body = html.read_text()
    assert "OOMs" in body and str(scenario["children"]["leak"].pid) in body


def test_nothing_is_left_on_the_gpu(scenario):
    from gpuwatch.sources.nvml import NvmlBackend

    pids = {c.pid for c in scenario["children"].values()}
    assert all(c.proc.poll() is not None for c in scenario["children"].values())
    backend = NvmlBackend()
    backend.open()
    try:
        def gone():
            return not pids & {p.pid for g in backend.sample(time.time()) for p in g.processes}
        wait_until(gone, 30, 0.5, "our processes to leave the GPU")
    finally:
        backend.close()
