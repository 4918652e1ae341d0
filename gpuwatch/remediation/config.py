"""Remediation hooks, policy, guardrails and the Alertmanager webhook."""

from __future__ import annotations

import msgspec


class RemediationConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    dry_run: bool = False


class WebhookConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Without a token the /alertmanager endpoint is disabled.
    token: str = ""
