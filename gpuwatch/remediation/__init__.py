"""Remediation: hooks (flush, snapshot, signal, exec), the policy that picks them, the
guardrails that limit them, the audit log that accounts for them, and the Alertmanager
webhook that can trigger them. See docs/remediation.md."""
