"""The daemon's adoption of OOM records (sources/oom_records.py) against files of another
user: a record hard-linked under its name, and a user directory handed to someone else, each
with a real record of a real process of that user. Nothing is adopted, and it says why."""

from __future__ import annotations

import os
import time

import msgspec
import psutil
import pytest

from gpuwatch.model import GpuSample, ProbeSample, ProcessSample
from gpuwatch.probe_channel import oom as fmt
from gpuwatch.sources.oom_records import OomReader
from gpuwatch.sources.probes import ensure_user_dir, prepare_probe_dir
from tests.other_uids import ALICE, MALLORY, needs_root, run_as

pytestmark = needs_root
UUID = "GPU-bite-oom"


@pytest.fixture
def alice(shared_tmp, sleepers):
    """(probe dir, alice's live process, its create time, its first record's name), the
    record written by alice into her directory."""
    base = shared_tmp / "probe"
    prepare_probe_dir(str(base))
    ensure_user_dir(str(base), ALICE)
    proc = sleepers(ALICE, base)
    ct = psutil.Process(proc.pid).create_time()
    rec = fmt.OomRecord(pid=proc.pid, seq=1, t=ct + 1, create_time=ct, final=True,
                        request_bytes=64 << 20, device_free_bytes=0)
    name = fmt.record_name(proc.pid, 1)
    run_as(ALICE, "open(args[0], 'w').write(args[1])", base / str(ALICE) / name,
           msgspec.json.encode(rec).decode())
    return base, proc, ct, name


def adopt(base, proc, ct, snaps) -> tuple[OomReader, list, list[str]]:
    gpu = GpuSample(index=0, uuid=UUID, name="NVIDIA H200", memory_total_bytes=140 << 30,
                    memory_used_bytes=100 << 30,
                    processes=[ProcessSample(pid=proc.pid, name="python3", create_time=ct)])
    probe = ProbeSample(pid=proc.pid, device=0, gpu_uuid=UUID, num_ooms=1, create_time=ct,
                        reserved_bytes=1 << 30)
    reader, problems = OomReader(str(base)), []
    got = reader.read(time.time(), [gpu], [probe], snapshot_dir=str(snaps),
                      max_total_bytes=64 << 20, problems=problems)
    return reader, got, problems


def test_a_good_record_is_adopted(alice, shared_tmp):
    base, proc, ct, _ = alice
    _, got, problems = adopt(base, proc, ct, shared_tmp / "snaps")
    assert [(s.pid, s.seq) for s in got] == [(proc.pid, 1)] and problems == []


def test_a_record_hard_linked_under_its_name_is_refused(alice, shared_tmp):
    """alice links her record to a second name: one file, two links. The owner is right,
    only the link count tells that the name is not the record's own."""
    base, proc, ct, name = alice
    run_as(ALICE, "os.link(args[0], args[0] + '.kept')", base / str(ALICE) / name)
    reader, got, problems = adopt(base, proc, ct, shared_tmp / "snaps")
    assert got == [] and reader.refused == 1
    assert any("2 links" in p for p in problems), problems


def test_a_user_directory_another_uid_owns_is_not_read(alice, shared_tmp):
    base, proc, ct, name = alice
    os.chown(base / str(ALICE), MALLORY, MALLORY)
    _, got, problems = adopt(base, proc, ct, shared_tmp / "snaps")
    assert got == [] and (base / str(ALICE) / name).exists()
    assert any(f"owned by uid {MALLORY}, not {ALICE}" in p for p in problems), problems
