"""The audit log: owner-only, one fsynced JSON line per record, rotation, and a writer killed
mid-stream loses nothing it reported written."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

from gpuwatch.remediation.audit import AuditLog, read_records
from tests.helpers import REPO


def test_records_are_lines_and_file_is_owner_only(tmp_path):
    path = tmp_path / "state" / "audit.jsonl"
    log = AuditLog(path)
    log.write({"action": "snapshot", "result": "ok", "n": 1})
    log.write({"action": "signal", "result": "refused", "reason": "pid reused"})
    log.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = path.read_text().splitlines()
    assert [json.loads(x)["action"] for x in lines] == ["snapshot", "signal"]


def test_existing_file_with_wide_mode_is_tightened(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_text('{"old": 1}\n')
    path.chmod(0o644)
    AuditLog(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert list(read_records(path)) == [{"old": 1}]


def test_rotation_keeps_the_configured_number_of_backups(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, max_bytes=200, backups=2)
    for i in range(40):
        log.write({"i": i, "pad": "x" * 40})
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    for p in tmp_path.iterdir():
        assert p.stat().st_size <= 200
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    # Oldest to newest across the files: a contiguous run that ends with the last record.
    seen = [r["i"] for name in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl")
            for r in read_records(tmp_path / name)]
    assert seen == list(range(seen[0], 40))
    assert len(seen) >= 3


def test_torn_last_line_is_tolerated_on_restart(tmp_path):
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.write({"i": 0})
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"i": 1, "action": "sig')  # what a crash mid-write leaves
    log = AuditLog(path)
    log.write({"i": 2})
    log.close()
    assert [r["i"] for r in read_records(path)] == [0, 2]
    assert path.read_text().splitlines()[-1] == '{"i":2}'


WRITER = """
import sys
from gpuwatch.remediation.audit import AuditLog
log = AuditLog(sys.argv[1], max_bytes=0)
i = 0
while True:
    log.write({"i": i, "action": "snapshot", "result": "ok", "pad": "y" * 100})
    print(i, flush=True)
    i += 1
"""


def test_writer_killed_mid_stream_loses_nothing_acknowledged(tmp_path):
    path = tmp_path / "audit.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    acknowledged = -1
    for line in proc.stdout:
        acknowledged = int(line)
        if acknowledged >= 200:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    records = [r["i"] for r in read_records(path)]
    # Every record the writer reported as written is there, in order, nothing duplicated.
    assert records[: acknowledged + 1] == list(range(acknowledged + 1))
    assert records == list(range(len(records)))
    # A new writer appends after whatever the crash left.
    log = AuditLog(path)
    log.write({"i": "after"})
    log.close()
    assert list(read_records(path))[-1] == {"i": "after"}
