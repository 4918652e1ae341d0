"""Recordings round-trip, tolerate a crash, and reject what is not one."""

from __future__ import annotations

import gzip

import pytest

from gpuwatch.model import EngineSample, GpuSample, ProcessSample, Tick
from gpuwatch.recording import Recorder, RecordingError, read_recording


def ticks(n: int) -> list[Tick]:
    return [
        Tick(t=1000.0 + 3 * i, gpus=[GpuSample(
            index=0, uuid="GPU-x", name="NVIDIA A100-SXM4-80GB",
            memory_total_bytes=85899345920, memory_used_bytes=10**9 + i,
            processes=[ProcessSample(pid=42, name="python3", used_memory_bytes=5 * 10**8,
                                     create_time=900.0)])],
            engines=[EngineSample(name="vllm-0", kind="vllm", exposition="a 1\n")] if i % 2 else [])
        for i in range(n)
    ]


@pytest.mark.parametrize("name", ["rec.jsonl", "rec.jsonl.gz"])
def test_round_trip(tmp_path, name):
    path = str(tmp_path / name)
    rec = Recorder(path, host="h", interval_s=3)
    for t in ticks(5):
        rec.write(t)
    rec.close()
    assert (tmp_path / name).stat().st_mode & 0o777 == 0o600
    header, it = read_recording(path)
    assert header.host == "h" and header.interval_s == 3
    assert list(it) == ticks(5)


def test_absent_fields_are_omitted_not_zero(tmp_path):
    path = str(tmp_path / "r.jsonl")
    rec = Recorder(path, host="h", interval_s=3)
    rec.write(Tick(t=1.0, gpus=[GpuSample(index=0, uuid="u")]))
    rec.close()
    line = (tmp_path / "r.jsonl").read_text().splitlines()[1]
    assert "memory_used_bytes" not in line and "engines" not in line


def test_design_example_is_readable(tmp_path):
    path = tmp_path / "design.jsonl"
    path.write_text(
        '{"format": "gpuwatch-recording", "version": 1, "host": "h", "interval_s": 3}\n'
        '{"t": 1764489600.0, "gpus": [{"index": 0, "uuid": "GPU-1", "name": "NVIDIA A100-SXM4'
        '-80GB", "memory_total_bytes": 85899345920, "memory_used_bytes": 64424509440, '
        '"processes": [{"pid": 4242, "name": "python3", "used_memory_bytes": 63000000000, '
        '"create_time": 1764480000.0}]}], "future_field": {"ignored": true}, '
        '"probes": [{"pid": 4242, "allocated_bytes": 0, "reserved_bytes": 0, '
        '"inactive_split_bytes": 0, "largest_free_block_bytes": 0, "free_blocks": 0}]}\n')
    _, it = read_recording(str(path))
    (tick,) = list(it)
    assert tick.gpus[0].processes[0].used_memory_bytes == 63000000000
    assert tick.probes[0].pid == 4242


def write_torn(path, n: int = 3):
    """A recording of n ticks whose next line was cut by a crash mid-write."""
    rec = Recorder(str(path), host="h", interval_s=3)
    for t in ticks(n):
        rec.write(t)
    rec.close()
    with open(path, "a") as f:
        f.write('{"t": 1009.0, "gpus": [{"ind')
    return path


def test_torn_last_line_ends_the_recording(tmp_path):
    path = write_torn(tmp_path / "r.jsonl")
    assert len(list(read_recording(str(path))[1])) == 3


def test_truncated_gzip_keeps_what_was_flushed(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    rec = Recorder(str(path), host="h", interval_s=3, gzip_flush_every=1)
    for t in ticks(4):
        rec.write(t)
    rec._f.flush()
    data = path.read_bytes()  # no gzip trailer: as if killed
    path.write_bytes(data)
    assert len(list(read_recording(str(path))[1])) == 4


def test_bad_line_in_the_middle_is_an_error_with_line_number(tmp_path):
    path = tmp_path / "r.jsonl"
    rec = Recorder(str(path), host="h", interval_s=3)
    rec.write(ticks(1)[0])
    rec.close()
    with open(path, "a") as f:
        f.write("garbage\n")
        f.write('{"t": 5.0}\n')
    with pytest.raises(RecordingError, match="line 3"):
        list(read_recording(str(path))[1])


def test_not_a_recording(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"format": "something-else", "version": 1}\n')
    with pytest.raises(RecordingError, match="format"):
        read_recording(str(p))
    g = tmp_path / "y.jsonl.gz"
    g.write_bytes(gzip.compress(b"not json\n"))
    with pytest.raises(RecordingError, match="line 1"):
        read_recording(str(g))
