"""Webhook de-duplication expires after exactly `dedup_seconds`, oldest entries first."""

from __future__ import annotations

from gpuwatch.remediation import webhook as webhook_mod
from gpuwatch.remediation.config import WebhookConfig
from tests.test_remediation_webhook import TOKEN, Server, alert, payload, run, snap_with


def test_dedup_expires_after_dedup_seconds(tmp_path):
    now = [1000.0]

    async def go():
        cfg = WebhookConfig(token=TOKEN, dedup_seconds=60)
        async with Server(tmp_path, cfg, snap_with([(4242, 1.0)])) as s:
            s.rem.webhook.clock = lambda: now[0]
            out = []
            for t in (1000.0, 1059.9, 1060.0, 1100.0):
                now[0] = t
                out.append((await s.post(payload(alert())))[1])
                await s.settle()
            return out
    first, inside, at_expiry, after = run(go())
    assert first["actions"] and not first.get("ignored")
    assert inside["ignored"][0]["reason"] == "duplicate" and inside["actions"] == []
    # Seen at 1000 with a 60 s window: at 1060 it is new again, and is then remembered anew.
    assert at_expiry["actions"] and not at_expiry.get("ignored")
    assert after["ignored"][0]["reason"] == "duplicate"


def test_dedup_table_is_bounded_and_forgets_the_oldest(tmp_path, monkeypatch):
    monkeypatch.setattr(webhook_mod, "DEDUP_MAX_ENTRIES", 3)
    now = [1000.0]

    async def go():
        async with Server(tmp_path, WebhookConfig(token=TOKEN), snap_with([(4242, 1.0)]),
                          rate_limit=1000, max_concurrent=100) as s:
            s.rem.webhook.clock = lambda: now[0]
            for i in range(5):
                now[0] += 1
                await s.post(payload(alert(fingerprint=f"fp{i}")))
            await s.settle()
            oldest = (await s.post(payload(alert(fingerprint="fp0"))))[1]
            newest = (await s.post(payload(alert(fingerprint="fp4"))))[1]
            await s.settle()
            return oldest, newest, len(s.rem.webhook._seen)
    oldest, newest, kept = run(go())
    assert oldest["actions"]  # forgotten: acted on again
    assert newest["ignored"][0]["reason"] == "duplicate"  # still remembered
    assert kept <= 3 + 1
