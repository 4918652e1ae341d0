"""Outputs over HTTP: /metrics, /healthz, /readyz, /api/state."""
