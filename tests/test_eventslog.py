"""The events log's queue across a failing disk: order, whole lines, bounded memory."""

from __future__ import annotations

import errno
import json

from gpuwatch import eventslog
from gpuwatch.eventslog import EventsLog


class Disk:
    """os.write that fails with ENOSPC, or writes only `room` more bytes, while full."""

    def __init__(self, real):
        self.real, self.room = real, None

    def __call__(self, fd, data):
        if self.room is None:
            return self.real(fd, data)
        if self.room == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = self.real(fd, data[:self.room])
        self.room -= n
        return n


def test_queue_survives_a_full_disk_in_order_and_whole(tmp_path, monkeypatch, caplog):
    disk = Disk(eventslog.os.write)
    monkeypatch.setattr(eventslog.os, "write", disk)
    now = [0.0]
    log = EventsLog(str(tmp_path / "e.jsonl"), max_pending=5, retry_seconds=1.0,
                    clock=lambda: now[0])
    log.write(json.dumps({"n": 0}))
    disk.room = 4  # the next line is cut after 4 bytes
    for n in range(1, 9):
        log.write(json.dumps({"n": n}))
    assert log.pending == 6 and log.dropped == 2
    log.retry()  # not due yet: nothing tried
    disk.room = None
    log.retry()
    assert log.pending == 6
    now[0] = 1.5
    log.retry()
    assert log.pending == 0
    lines = [json.loads(x) for x in (tmp_path / "e.jsonl").read_text().splitlines()]
    # Line 1 was cut and completed; 2 and 3 were dropped (oldest first) when the queue was full.
    assert [x["n"] for x in lines] == [0, 1, 4, 5, 6, 7, 8]
    assert "resumed after a gap of 1.5 s: 6 events held and written now, 2 dropped" in (
        caplog.text)
    log.close()
