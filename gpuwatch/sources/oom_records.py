"""The daemon's side of the OOM flight recorder: finds the records probes leave when their
process runs out of GPU memory (gpuwatch.probe_channel.oom), adopts them into the snapshot
directory and turns each into an OomSample of the tick.

Nothing is listed. A record is looked for by its one possible name, `<probe dir>/<uid>/
oom-<pid>-<seq>.json`, only for a process whose probe this daemon has read (so its uid and
start time are known, checked while it was alive), and only when there is a reason: its
first sight, its allocator's `num_ooms` rising, or its exit (an OOM often kills it; its
record outlives it). A record is believed when its directory and file belong to that uid
(the channel's rules, protocol.py) and it names that pid, seq and start time; the cause is
worked out again from its figures. A record still open (its burst not over) waits for the
probe to finish it while the process lives, PENDING_WAIT_SECONDS at most. Adoption copies the
record (and its history pickle) with the snapshot hook's copy and cap, then removes the
probe's files. Bounded per read: MAX_PER_READ records. Blocking: run it off the event loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec
import psutil

from gpuwatch.model import ATTRIBUTION_FIELDS, GpuSample, OomSample, ProbeSample
from gpuwatch.probe_channel import oom as fmt
from gpuwatch.probe_channel import protocol
from gpuwatch.probe_channel.requests import copy_named, open_user_dir
from gpuwatch.remediation.hooks import Target
from gpuwatch.remediation.hooks import snapshot as snapshot_hook

log = logging.getLogger(__name__)

PENDING_WAIT_SECONDS = 30.0
LINGER_SECONDS = 15.0  # an exited process's records are looked for this long
MAX_PER_READ = 16
MAX_KNOWN = 8192
HISTORY_MAX_BYTES = 1 << 30
_CREATE_TIME_SLACK = 1.0


@dataclass
class _Proc:
    uid: int
    create_time: float | None
    next_seq: int = 1
    num_ooms: int = 0
    check: bool = True
    gone_at: float | None = None
    gpu_uuid: str | None = None
    owner: dict[str, str] = field(default_factory=dict)  # name and attribution, last seen
    pending_since: float | None = None


class OomReader:
    def __init__(self, probe_dir: str) -> None:
        self.probe_dir = probe_dir
        self._procs: dict[int, _Proc] = {}
        self.adopted = 0
        self.refused = 0

    @property
    def watching(self) -> bool:
        """Whether any process is known (an exited one's records are still looked for)."""
        return bool(self._procs)

    def read(self, now: float, gpus: Iterable[GpuSample], probes: Iterable[ProbeSample], *,
             snapshot_dir: str, max_total_bytes: int,
             problems: list[str] | None = None) -> list[OomSample]:
        notes = problems if problems is not None else []
        self._learn(now, list(gpus), list(probes))
        out: list[OomSample] = []
        for pid in sorted(p for p, s in self._procs.items() if s.check):
            if len(out) >= MAX_PER_READ:
                notes.append(f"more than {MAX_PER_READ} OOM records: the rest next time")
                break
            out += self._look(now, pid, self._procs[pid], snapshot_dir, max_total_bytes,
                              MAX_PER_READ - len(out), notes)
        for pid in [p for p, s in self._procs.items()
                    if s.gone_at is not None and now - s.gone_at > LINGER_SECONDS]:
            del self._procs[pid]
        return out

    # -- who is there ---------------------------------------------------------------------
    def _learn(self, now: float, gpus: list[GpuSample], probes: list[ProbeSample]) -> None:
        by_pid = {p.pid: (g, p) for g in gpus for p in g.processes}
        uuids = {g.uuid for g in gpus}
        seen: set[int] = set()
        for s in probes:
            if s.pid in seen:
                continue
            seen.add(s.pid)
            proc = self._procs.get(s.pid)
            if proc is None or (None not in (proc.create_time, s.create_time) and abs(
                    proc.create_time - s.create_time) > _CREATE_TIME_SLACK):  # type: ignore[operator]
                if len(self._procs) >= MAX_KNOWN:
                    continue
                uid = _uid_of(s.pid, s.create_time)
                if uid is None:
                    continue
                proc = self._procs[s.pid] = _Proc(uid, s.create_time)
            proc.gone_at = None
            ooms = max((x.num_ooms or 0) for x in probes if x.pid == s.pid)
            if ooms > proc.num_ooms:
                proc.num_ooms, proc.check = ooms, True
            gpu, nvml = by_pid.get(s.pid, (None, None))
            # the device's UUID as the probe read it from CUDA, when NVML knows that GPU;
            # else the GPU NVML lists the process on
            if s.gpu_uuid and s.gpu_uuid in uuids:
                proc.gpu_uuid = s.gpu_uuid
            elif gpu is not None:
                proc.gpu_uuid = gpu.uuid
            if nvml is not None:
                proc.owner = {"name": nvml.name, **{f: getattr(nvml, f)
                                                    for f in ATTRIBUTION_FIELDS}}
        for pid, proc in self._procs.items():
            if pid not in seen and proc.gone_at is None:
                proc.gone_at, proc.check = now, True  # exited, or no longer on a GPU

    # -- finding and adopting -------------------------------------------------------------
    def _look(self, now: float, pid: int, proc: _Proc, snapshot_dir: str,
              max_total_bytes: int, room: int, notes: list[str]) -> list[OomSample]:
        out: list[OomSample] = []
        try:
            dir_fd = open_user_dir(self.probe_dir, proc.uid)
        except FileNotFoundError:
            proc.check = proc.gone_at is not None
            return out
        except (OSError, ValueError) as exc:
            notes.append(f"{self.probe_dir}/{proc.uid}: {exc}")
            proc.check = False
            return out
        try:
            while len(out) < room and proc.next_seq <= fmt.MAX_SEQ:
                seq = proc.next_seq
                name = fmt.record_name(pid, seq)
                try:
                    rec = self._read(dir_fd, proc, pid, seq, name)
                except FileNotFoundError:
                    break
                except (OSError, ValueError) as exc:
                    self.refused += 1
                    notes.append(f"{self.probe_dir}/{proc.uid}/{name}: {exc}")
                    protocol.unlink_quietly(dir_fd, name)
                    proc.next_seq += 1
                    continue
                if not rec.final and proc.gone_at is None:
                    if proc.pending_since is None:
                        proc.pending_since = now
                    if now - proc.pending_since < PENDING_WAIT_SECONDS:
                        return out  # its probe finishes it within a second or so
                proc.pending_since = None
                out.append(self._adopt(dir_fd, proc, pid, rec, snapshot_dir, max_total_bytes))
                proc.next_seq += 1
            proc.check = proc.gone_at is not None
        finally:
            os.close(dir_fd)
        return out

    def _read(self, dir_fd: int, proc: _Proc, pid: int, seq: int,
              name: str) -> fmt.OomRecord:
        data, st = protocol.read_regular(dir_fd, name, fmt.MAX_RECORD_BYTES)
        if st.st_uid != proc.uid:
            raise ValueError(f"owned by uid {st.st_uid}, not {proc.uid}")
        if st.st_nlink != 1:
            raise ValueError(f"{st.st_nlink} links")
        try:
            rec = fmt.record_decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"not an OOM record: {exc}") from None
        if rec.format != fmt.FORMAT or rec.pid != pid or rec.seq != seq:
            raise ValueError("not the OOM record of this pid and number")
        if None not in (rec.create_time, proc.create_time) and abs(
                rec.create_time - proc.create_time) > _CREATE_TIME_SLACK:  # type: ignore[operator]
            raise ValueError("the record of an earlier process under this pid")
        return rec

    def _adopt(self, dir_fd: int, proc: _Proc, pid: int, rec: fmt.OomRecord,
               snapshot_dir: str, max_total_bytes: int) -> OomSample:
        sample = to_sample(rec, proc.gpu_uuid, proc.owner, exited=proc.gone_at is not None)
        name = fmt.record_name(pid, rec.seq)
        copies = [("oom.json", lambda dest: copy_named(dir_fd, proc.uid, name, dest,
                                                       fmt.MAX_RECORD_BYTES))]
        history = fmt.history_name(pid, rec.seq)
        if rec.history == history:
            cap = min(max_total_bytes, HISTORY_MAX_BYTES)
            copies.append(("oom-history.pickle",
                           lambda dest: copy_named(dir_fd, proc.uid, history, dest, cap)))
        target = Target(kind="process", gpu_uuid=sample.gpu_uuid, pid=pid,
                        create_time=proc.create_time, process_name=sample.name)
        try:
            adopted, _deleted, failed = snapshot_hook.adopt(
                copies, target, rec.t, directory=snapshot_dir, max_total_bytes=max_total_bytes,
                owner=f"uid{proc.uid}")  # the process may be gone: its user is known
        except OSError as exc:
            adopted, failed = {}, {"oom.json": f"{snapshot_dir}: {exc.strerror or exc}"}
        sample.record = adopted.get("oom.json", "")
        sample.history = adopted.get("oom-history.pickle", "")
        if failed:
            sample.problem = "; ".join(f"{k}: {v}" for k, v in failed.items())[:300]
        protocol.unlink_quietly(dir_fd, name)
        protocol.unlink_quietly(dir_fd, history)
        self.adopted += 1
        return sample


def to_sample(rec: fmt.OomRecord, gpu_uuid: str | None, owner: dict[str, str],
              exited: bool) -> OomSample:
    """What the tick carries of a record: typed figures (the texts a probe wrote are not
    taken, except where they name a known value), the cause worked out here."""
    s = rec.summary
    reserved = max(0, rec.stats.get("reserved_bytes.all.current", s.reserved_bytes))
    allocated = max(0, rec.stats.get("allocated_bytes.all.current", s.allocated_bytes))
    outcome = rec.outcome if rec.outcome in fmt.OUTCOMES else "unknown"
    if outcome == "pending":
        outcome = "unknown"  # the process died (or the probe stopped) before finishing it
    pools = {p.pool[:40]: p.reserved_bytes for p in s.pools[:fmt.TOP]}
    return OomSample(
        pid=rec.pid, t=round(rec.t, 3), seq=rec.seq, create_time=rec.create_time,
        gpu_uuid=gpu_uuid, device=rec.device,
        **{k: str(v)[:256] for k, v in owner.items() if v},
        request_bytes=rec.request_bytes, device_free_bytes=rec.device_free_bytes,
        device_total_bytes=rec.device_total_bytes, allowed_bytes=rec.allowed_bytes,
        reserved_bytes=reserved, allocated_bytes=allocated, cached_free_bytes=s.free_bytes,
        largest_free_block_bytes=s.largest_free_block_bytes,
        fragmentation_ratio=s.fragmentation_ratio, pools=pools,
        observer_calls=rec.observer_calls,
        cause=fmt.classify(rec.request_bytes, rec.device_free_bytes, s.free_bytes, reserved,
                           rec.allowed_bytes),
        outcome=outcome, exited=exited or rec.exited, capture_seconds=rec.capture_seconds)


def _uid_of(pid: int, create_time: float | None) -> int | None:
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > _CREATE_TIME_SLACK:
            return None
        return proc.uids().real
    except psutil.Error:
        return None
