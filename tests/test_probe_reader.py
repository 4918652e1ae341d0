"""The daemon's reader of probe records: what it believes and what it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from gpuwatch.probe_channel.config import ProbeConfig, from_environ, resolve_dir
from gpuwatch.sources.probes import read_probes

ROOT = os.geteuid() == 0
NOW = time.time()
ME = psutil.Process()


def record(pid=None, t=None, create_time=None, **sample) -> dict:
    pid = os.getpid() if pid is None else pid
    base = {"pid": pid, "device": 0, "allocated_bytes": 100, "reserved_bytes": 200,
            "inactive_split_bytes": 50, "free_blocks": 3, "largest_free_block_bytes": 60,
            "smallest_free_block_bytes": 10, "total_free_bytes": 100, "segments": 2,
            "gpu_uuid": "GPU-1234"}
    base.update(sample)
    return {"format": "gpuwatch-probe", "version": 1, "pid": pid,
            "t": NOW if t is None else t,
            "create_time": ME.create_time() if create_time is None else create_time,
            "interval_seconds": 5.0, "status": "ok", "samples": [base]}


def publish(probe_dir, rec, uid=None, name=None, mode=0o600):
    uid = os.geteuid() if uid is None else uid
    d = probe_dir / str(uid)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = d / (name or f"{rec['pid']}.json")
    path.write_text(json.dumps(rec) if isinstance(rec, dict) else rec)
    path.chmod(mode)
    return path


def test_reads_a_live_record(tmp_path):
    publish(tmp_path, record(t=NOW - 2))
    problems: list[str] = []
    [s] = read_probes(str(tmp_path), NOW, problems=problems)
    assert problems == []
    assert (s.pid, s.device, s.reserved_bytes, s.largest_free_block_bytes) == \
        (os.getpid(), 0, 200, 60)
    assert s.t == NOW - 2 and s.create_time == pytest.approx(ME.create_time())


def test_missing_directory_is_empty(tmp_path):
    assert read_probes(str(tmp_path / "nope"), NOW) == []


def test_stale_record_is_ignored(tmp_path):
    publish(tmp_path, record(t=NOW - 60))
    assert read_probes(str(tmp_path), NOW, stale_after=30) == []
    # a probe that announced a long interval is stale only after three of them
    rec = record(t=NOW - 60)
    rec["interval_seconds"] = 40.0
    publish(tmp_path, rec)
    assert len(read_probes(str(tmp_path), NOW, stale_after=30)) == 1


def test_dead_process_is_ignored_and_pruned(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ct = psutil.Process(child.pid).create_time() if psutil.pid_exists(child.pid) else NOW
    child.wait()
    path = publish(tmp_path, record(pid=child.pid, create_time=ct))
    assert read_probes(str(tmp_path), NOW) == []
    assert not path.exists()
    # prune=False leaves it alone
    path = publish(tmp_path, record(pid=child.pid, create_time=ct))
    assert read_probes(str(tmp_path), NOW, prune=False) == []
    assert path.exists()


def test_reused_pid_is_ignored(tmp_path):
    publish(tmp_path, record(create_time=ME.create_time() - 3600))
    assert read_probes(str(tmp_path), NOW) == []


@pytest.mark.parametrize("content", [
    "{not json", "[]", '{"format": "other", "pid": 1, "t": 1}', "", '{"pid": "x"}',
])
def test_garbage_is_reported_not_raised(tmp_path, content):
    publish(tmp_path, content, name=f"{os.getpid()}.json")
    problems: list[str] = []
    assert read_probes(str(tmp_path), NOW, problems=problems) == []
    assert len(problems) == 1 and f"{os.getpid()}.json" in problems[0]


def test_record_naming_another_pid_is_refused(tmp_path):
    publish(tmp_path, record(), name="1.json")
    problems: list[str] = []
    assert read_probes(str(tmp_path), NOW, problems=problems) == []
    assert problems


def test_oversized_symlinked_and_fifo_records_are_refused(tmp_path):
    d = tmp_path / str(os.geteuid())
    d.mkdir(mode=0o700)
    (d / f"{os.getpid()}.json").write_text(" " * 300_000)
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps(record()))
    os.symlink(target, d / "1.json")
    os.mkfifo(d / "2.json")
    problems: list[str] = []
    assert read_probes(str(tmp_path), NOW, problems=problems) == []  # the FIFO did not block
    assert len(problems) == 3, problems


def test_user_directory_must_belong_to_its_uid(tmp_path):
    # a directory named for another uid, but owned by us
    other = 4321 if os.geteuid() != 4321 else 4322
    publish(tmp_path, record(), uid=other)
    problems: list[str] = []
    assert read_probes(str(tmp_path), NOW, problems=problems) == []
    assert any("owned by uid" in p for p in problems)


@pytest.mark.skipif(not ROOT, reason="needs root to hand files to another uid")
def test_another_user_cannot_publish_for_my_process(tmp_path):
    # uid 4321 owns its directory and file, but the pid is ours (uid 0)
    path = publish(tmp_path, record(), uid=4321)
    os.chown(path.parent, 4321, -1)
    os.chown(path, 4321, -1)
    problems: list[str] = []
    assert read_probes(str(tmp_path), NOW, problems=problems) == []
    assert any("belongs to uid 0" in p for p in problems)
    # a file in our directory owned by someone else is refused too
    mine = publish(tmp_path, record())
    os.chown(mine, 4321, -1)
    problems.clear()
    assert read_probes(str(tmp_path), NOW, problems=problems) == []
    assert any("owned by uid 4321" in p for p in problems)


def test_environment_configures_the_probe_and_bad_values_keep_defaults(caplog):
    cfg = from_environ({"GPUWATCH_PROBE_INTERVAL_SECONDS": "0.5",
                        "GPUWATCH_PROBE_DIR": "/x", "GPUWATCH_PROBE_REQUEST_UIDS": "5, 6",
                        "GPUWATCH_PROBE_MAX_OVERHEAD_RATIO": "7",  # out of range
                        "GPUWATCH_PROBE_NOPE": "1", "PATH": "/bin"})
    assert (cfg.interval_seconds, cfg.dir, cfg.request_uids) == (0.5, "/x", [5, 6])
    assert cfg.max_overhead_ratio == ProbeConfig().max_overhead_ratio
    text = caplog.text
    assert "GPUWATCH_PROBE_MAX_OVERHEAD_RATIO" in text and "GPUWATCH_PROBE_NOPE" in text


def test_probe_settings_in_the_environment_are_valid_daemon_settings():
    from gpuwatch.config import load

    cfg = load(environ={"GPUWATCH_PROBE_ENABLED": "1", "GPUWATCH_PROBE_DIR": "/x",
                        "GPUWATCH_PROBE_INTERVAL_SECONDS": "2"})
    assert (cfg.probe.enabled, cfg.probe.dir, cfg.probe.interval_seconds) == (True, "/x", 2.0)


def test_default_directory(tmp_path):
    assert resolve_dir("/given") == "/given"
    d = resolve_dir("")
    if ROOT:
        assert d == "/run/gpuwatch/probe"
    else:
        assert d.endswith(f"gpuwatch-{os.geteuid()}/probe") or d == "/run/gpuwatch/probe"
