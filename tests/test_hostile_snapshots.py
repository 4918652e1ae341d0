"""Users' snapshots against each other, through the real daemon: Alertmanager-style alerts
make it snapshot the processes of six users (real processes of those uids, answering as
their probe would); one of them answers with a sparse file, with files as large as the cap,
and with one past it.

Before: one snapshot could be as large as the whole cap (2 GiB), the sparse 30 MiB file
(16 KiB on disk) made root write 30 MiB, and making room deleted the oldest files of anyone:
the victims' snapshots went first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import hostile_users as hu
from tests.helpers import wait_until

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not hu.ROOT, reason="needs root to run processes of other uids")]

MIB = 1 << 20
TOKEN = "hostile-snapshots-token-0123456789"
VICTIMS = (5001, 5002, 5003, 5004, 5005)


def test_one_users_snapshots_never_erase_anothers(daemon, procs, probe_dir, tmp_path):
    def probe(uid: int, mode: str, size: int) -> int:
        return procs.script(hu.SNAP_PROBE, probe_dir, mode, str(size), uid=uid).pid

    victims = {uid: probe(uid, "dense", MIB) for uid in VICTIMS}
    late = probe(5006, "dense", 30 * MIB)  # asks once the directory is mostly taken
    sparse = probe(hu.ATTACKER, "sparse", 30 * MIB)
    dense = probe(hu.ATTACKER, "dense", 30 * MIB)
    huge = probe(hu.ATTACKER, "dense", 33 * MIB)
    pids = [*victims.values(), late, sparse, dense, huge]
    (tmp_path / "gpu-pids").write_text("".join(f"{p}\n" for p in pids))
    snaps = tmp_path / "snaps"
    d = daemon(module="tests.fake_nvml_daemon",
               env={"FAKE_NVML_PIDS_FILE": str(tmp_path / "gpu-pids")}, config_toml=f"""
[probe]
dir = "{probe_dir}"
[remediation]
cooldown_seconds = 0
rate_limit = 1000
max_concurrent = 1
[remediation.snapshot]
dir = "{snaps}"
max_total_bytes = {64 * MIB}
max_user_bytes = {40 * MIB}
max_snapshot_bytes = {32 * MIB}
[webhook]
token = "{TOKEN}"
""")
    wait_until(lambda: {p["pid"] for p in d.state()["sample"].get("probes", ())} >= set(pids),
               30, what="every probe read")
    uuid = d.state()["sample"]["gpus"][0]["uuid"]

    def snapshot(pid: int, n: int = 0) -> dict:
        return hu.snapshot_via_webhook(d, pid, uuid, f"snap-{pid}-{n}", TOKEN)

    def pickles(uid: int) -> list[Path]:
        return sorted(snaps.glob(f"*-uid{uid}-allocator.pickle"))

    for pid in victims.values():
        assert snapshot(pid)["result"] == "ok"
    kept = {uid: pickles(uid) for uid in VICTIMS}
    assert all(len(v) == 1 for v in kept.values())

    # the sparse file: copied as what it holds, its hole left a hole
    assert snapshot(sparse)["result"] == "ok"
    [copy] = pickles(hu.ATTACKER)
    st = copy.stat()
    assert st.st_size == 30 * MIB and st.st_blocks * 512 <= 256 * 1024, st
    # files as large as one snapshot may be: room is made from the attacker's own only
    deleted = []
    for n in range(3):
        rec = snapshot(dense, n)
        assert rec["result"] == "ok", rec
        deleted += rec["detail"].get("deleted_for_cap", [])
    assert deleted and all(f"-uid{hu.ATTACKER}-" in name for name in deleted), deleted
    assert len(pickles(hu.ATTACKER)) == 1  # 40 MiB share: one of 30 MiB at a time
    # past the per-snapshot cap: refused, nothing copied
    rec = snapshot(huge)
    assert rec["result"] == "failed" and "more than" in rec["reason"], rec
    assert not list(snaps.glob(f"*-pid{huge}-*-allocator.pickle"))
    # a user whose snapshot does not fit beside the others' is refused; nobody is erased
    rec = snapshot(late)
    assert rec["result"] == "failed" and "more than" in rec["reason"], rec
    assert {uid: pickles(uid) for uid in VICTIMS} == kept
    total = sum(f.stat().st_size for f in snaps.iterdir())
    assert total <= 64 * MIB
