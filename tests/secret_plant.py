"""A configuration with a unique secret planted in every secret-bearing field."""

from __future__ import annotations

import secrets
import sys


def planted() -> dict[str, str]:
    """Field -> a secret no other text contains."""
    fields = ("engine_user", "engine_password", "engine_header", "engine_bearer",
              "flush_user", "flush_password", "flush_header", "exec_env", "exec_arg",
              "webhook_token")
    return {f: f"{f.replace('_', '')}{secrets.token_hex(8)}" for f in fields}


def config_toml(s: dict[str, str], *, engine_port: int, flush_port: int, extra: str = "") -> str:
    """Engines 'inference' (header, bearer token) and 'inference-basic' (URL userinfo) at
    engine_port, a flush endpoint at flush_port; an exec hook that prints its secrets."""
    # The digest shows that the hook got the real values; the values themselves must not
    # come out of the daemon.
    hook = ("import hashlib, os, sys; v = os.environ['HOOK_TOKEN'] + sys.argv[2]; "
            "print(hashlib.sha256(v.encode()).hexdigest(), os.environ['HOOK_TOKEN'], sys.argv[2]); "
            "print(sys.argv[2], os.environ['HOOK_TOKEN'], file=sys.stderr)")
    return f"""
{extra}
[[engines]]
name = "inference"
url = "http://127.0.0.1:{engine_port}/metrics"
headers = {{ X-Api-Key = "{s['engine_header']}" }}
bearer_token = "{s['engine_bearer']}"
interval_seconds = 1

[[engines]]
name = "inference-basic"
url = "http://{s['engine_user']}:{s['engine_password']}@127.0.0.1:{engine_port}/metrics"
interval_seconds = 1

[remediation]
cooldown_seconds = 0
max_concurrent = 4

[remediation.flush]
enabled = true
http_timeout_seconds = 2

[[remediation.flush.endpoints]]
engine = "inference"
url = "http://{s['flush_user']}:{s['flush_password']}@127.0.0.1:{flush_port}/reset_prefix_cache"
headers = {{ X-Flush-Key = "Key {s['flush_header']}" }}

[remediation.exec]
enabled = true
argv = ["{sys.executable}", "-c", "{hook}", "--token", "{s['exec_arg']}"]
secret_args = [4]
env = {{ HOOK_TOKEN = "{s['exec_env']}" }}

[webhook]
token = "{s['webhook_token']}"

[[webhook.routes]]
alertname = "SecretsTest"
actions = ["exec", "flush", "snapshot"]
"""
