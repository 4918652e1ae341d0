"""Every misuse of the CLI is one line on stderr naming the flag and the reason, exit status 2,
never a traceback: run as a user (and a service manager) would, in a child process."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from gpuwatch.recording import Recorder
from tests.helpers import child_env
from tests.test_recording import ticks, write_torn

# (argv, what stderr must name). {tmp} is the test's directory.
CASES = [
    (["run", "--engine", "not a url"], "--engine"),
    (["run", "--engine", "ftp://x/metrics"], "http://"),
    (["run", "--engine", ""], "--engine"),
    (["run", "--record", "/proc/nope/x.jsonl.gz"], "--record"),
    (["run", "--record", "{tmp}"], "is a directory"),
    (["run", "--events-log", "/proc/nope/events.jsonl"], "--events-log"),
    # As root this passes the flag check (root may write in /proc) and fails when opened:
    # still before anything is served.
    (["run", "--events-log", "/proc/nope", "--listen", "127.0.0.1:0"], "events_log|--events-log"),
    (["run", "--listen", "localhost:99999"], "out of range"),
    (["run", "--listen", "19999"], "':19999'"),
    (["run", "--listen", "::1:19500"], "brackets"),
    (["run", "--listen", "localhost"], "no port"),
    (["run", "--listen", "host:http"], "not a number"),
    (["run", "--simulate", "nope"], "--simulate"),
    (["run", "--seed", "x"], "--seed"),
    (["run", "--bogus"], "--bogus"),
    (["run", "--config", "/nonexistent/gpuwatch.toml"], "/nonexistent/gpuwatch.toml"),
    (["run", "--config", "{tmp}/bad.toml"], "nvml.fast_interval_seconds"),
    # with both, the HTTP client refuses every scrape: the engine would be down for good
    (["run", "--config", "{tmp}/two-auth.toml"], "engines[0]: credentials in the url and "
     "bearer_token"),
    (["run", "--log-level", "loud"], "--log-level"),
    (["nosuchcommand"], "nosuchcommand"),
    (["dashboards", "-o", "/proc/nope"], "-o/--output"),
    (["alerts", "-o", "/proc/nope"], "-o/--output"),
    (["alerts", "--format", "yaml"], "--format"),
    (["alerts", "--job", ""], "--job"),
    (["thresholds", "--memory-total", "lots"], "--memory-total"),
    (["thresholds", "--gpu-name", "A100"], "--memory-total"),
    (["thresholds", "--file", "/nonexistent.toml"], "/nonexistent.toml"),
    (["replay"], "RECORDING"),
    (["replay", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
    (["replay", "{tmp}/not-a-recording.jsonl"], "not-a-recording.jsonl"),
    (["replay", "{tmp}/events.jsonl"], "events log"),
    (["replay", "{tmp}/empty.jsonl"], "empty file"),
    (["replay", "{tmp}/garbage.jsonl.gz"], "garbage.jsonl.gz"),
    (["replay", "{tmp}/rec.jsonl", "--thresholds", "/nonexistent.toml"], "--thresholds"),
    (["config", "--config", "{tmp}/bad.toml"], "nvml.fast_interval_seconds"),
    (["check", "--config", "/nonexistent/gpuwatch.toml"], "/nonexistent/gpuwatch.toml"),
]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    (d / "bad.toml").write_text("[nvml]\nfast_interval_seconds = 0\n")
    (d / "two-auth.toml").write_text('[[engines]]\nname = "v"\nbearer_token = "s3cret-t"\n'
                                     'url = "http://user:s3cret-p@127.0.0.1:9/metrics"\n')
    (d / "not-a-recording.jsonl").write_text('{"a": 1}\n')
    (d / "events.jsonl").write_text(json.dumps({"t": 1.0, "signal": "memory_leak",
                                                "state": "firing"}) + "\n")
    (d / "empty.jsonl").write_text("")
    (d / "garbage.jsonl.gz").write_bytes(b"this is not gzip\n")
    rec = Recorder(str(d / "rec.jsonl"), host="h", interval_s=3)
    for t in ticks(2):
        rec.write(t)
    rec.close()
    return d


def gpuwatch(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwatch", *argv], capture_output=True,
                          text=True, timeout=timeout, env=child_env(), stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("argv", "names"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_misuse_is_one_line_exit_2(tmp, argv, names):
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]
    r = gpuwatch(*argv)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1, r.stderr
    assert any(n.replace("{tmp}", str(tmp)) in lines[0] for n in names.split("|")), lines[0]
    assert "serving on" not in r.stderr
    assert "s3cret" not in r.stderr


def test_help_and_version_exit_0():
    assert gpuwatch("--help").returncode == 0
    r = gpuwatch("--version")
    assert r.returncode == 0 and "gpuwatch" in r.stdout


def test_truncated_recording_is_replayed_to_the_cut_with_a_warning(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    rec = Recorder(str(path), host="h", interval_s=3, gzip_flush_seconds=0)
    for t in ticks(4):
        rec.write(t)
    rec._f.flush()  # killed here: no gzip trailer
    path.write_bytes(path.read_bytes())
    r = gpuwatch("replay", str(path))
    assert r.returncode == 0 and "Traceback" not in r.stderr
    (warning,) = r.stderr.splitlines()
    assert "truncated" in warning and "4 ticks" in warning and "after line 5" in warning
    assert "1970-01-01T00:" in warning  # the last tick read, as an ISO time
    strict = gpuwatch("replay", "--strict", str(path))
    assert strict.returncode == 1 and "truncated" in strict.stderr

    torn = write_torn(tmp_path / "torn.jsonl")
    r = gpuwatch("replay", "--strict", str(torn))
    assert r.returncode == 1 and "line 5 is torn" in r.stderr and "3 ticks" in r.stderr


def test_whole_recording_gives_no_warning(tmp):
    r = gpuwatch("replay", "--strict", str(tmp / "rec.jsonl"))
    assert r.returncode == 0 and r.stderr == ""


def test_gzip_that_is_not_gzip_names_the_file(tmp):
    bad = tmp / "plain.jsonl.gz"
    bad.write_bytes(gzip.compress(b"")[:5])
    r = gpuwatch("replay", str(bad))
    assert r.returncode == 2 and "plain.jsonl.gz" in r.stderr and "Traceback" not in r.stderr
