"""No planted secret leaves a running daemon. A unique secret sits in every secret-bearing
field (engine URL userinfo, engine header and bearer token, flush endpoint userinfo and
header, exec env value and a secret argv element, the webhook token); the daemon runs
`--simulate leak` with an engine and a flush endpoint, Alertmanager's webhook triggers exec,
flush and snapshot (for real: the hook prints its secrets, the flush fails quoting its URL;
and with --dry-run), SIGHUP loads a broken file that quotes a new credential. Then every
output is searched for every secret: /api/state, /metrics, the daemon's log, the events log,
the recording, and every file in the state directory (audit log, snapshots)."""

from __future__ import annotations

import hashlib
import http.server
import json
import signal
import urllib.request
from pathlib import Path

import pytest

from gpuwatch.remediation.audit import read_records
from tests.helpers import LoopbackServer, eventually, free_port
from tests.secret_plant import config_toml, planted

pytestmark = pytest.mark.integration

EXPOSITION = (b"# TYPE vllm:num_requests_running gauge\n"
              b'vllm:num_requests_running{model_name="m"} 1\n')


class EngineServer(LoopbackServer):
    """A loopback engine that answers its metrics and remembers the headers it was sent."""

    def __init__(self) -> None:
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(dict(self.headers))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(EXPOSITION)

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def post_alert(d, token: str, uuid: str, pid: int) -> int:
    alert = {"status": "firing", "fingerprint": "5ec7e75", "startsAt": "2026-01-01T00:00:00Z",
             "labels": {"alertname": "SecretsTest", "uuid": uuid, "pid": str(pid),
                        "engine": "inference", "severity": "critical"}}
    body = json.dumps({"version": "4", "status": "firing", "alerts": [alert]}).encode()
    req = urllib.request.Request(d.url + "/alertmanager", data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def outputs(d, work: Path, state_dir: Path) -> dict[str, str]:
    files = [p for p in (*state_dir.rglob("*"), *work.glob("*.jsonl*")) if p.is_file()]
    assert files, "no output files"
    return {str(p): p.read_bytes().decode(errors="replace") for p in files}


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "real"])
def test_no_planted_secret_appears_in_any_output(daemon, tmp_path, dry_run):
    s = planted()
    engine = EngineServer()
    try:
        extra = (f'events_log = "{tmp_path / "events.jsonl"}"\n'
                 f'record = "{tmp_path / "recording.jsonl"}"\n'
                 "[nvml]\nfast_interval_seconds = 0.5\n")
        toml = config_toml(s, engine_port=engine.port, flush_port=free_port(), extra=extra)
        d = daemon("--simulate", "leak", *(["--dry-run"] if dry_run else []), config_toml=toml)
        state_dir = tmp_path / f"state-{d.port}"
        assert eventually(lambda: engine.seen, 15), "the engine was never scraped"
        sample = d.state()["sample"]
        gpu = next(g for g in sample["gpus"] if g["processes"])
        assert post_alert(d, s["webhook_token"], gpu["uuid"], gpu["processes"][0]["pid"]) == 200

        def acted():
            audit = state_dir / "audit.jsonl"
            recs = [r for r in read_records(audit) if r.get("result") not in (None, "started")
                    ] if audit.exists() else []
            return {r["action"]: r for r in recs}
        assert eventually(lambda: {"exec", "flush", "snapshot"} <= acted().keys(), 20), acted()
        done = acted()
        if dry_run:
            assert {r["result"] for r in done.values()} == {"dry_run"}
            assert done["exec"]["detail"]["would_exec"][3:] == ["--token", "***"]
        else:
            # The hook saw the real values (it printed them) and the record shows masks.
            assert done["exec"]["result"] == "ok", done["exec"]
            digest = hashlib.sha256((s["exec_env"] + s["exec_arg"]).encode()).hexdigest()
            assert done["exec"]["detail"]["stdout_tail"] == f"{digest} *** ***\n"
            assert done["flush"]["result"] == "failed"
            assert "http://***@127.0.0.1" in done["flush"]["reason"]
            # The engine got its credentials: masking is on the way out only.
            assert any(h.get("X-Api-Key") == s["engine_header"] for h in engine.seen)
            assert any(h.get("Authorization", "").startswith("Basic ") for h in engine.seen)

        # A reload with a broken file that quotes a new credential: rejected, not quoted.
        s["reload_password"] = "reloadpassword5e1f0c2a"
        cfg_file = next(tmp_path.glob(f"gpuwatch-{d.port}.toml"))
        cfg_file.write_text(toml + '\n[[engines]]\nname = "x"\n'
                            f'url = "ftp://u:{s["reload_password"]}@h/metrics"\n')
        d.proc.send_signal(signal.SIGHUP)
        assert eventually(lambda: "reload rejected" in d.output(), 10)

        texts = {"/api/state": d.get("/api/state")[1].decode(),
                 "/metrics": d.metrics()}
        d.stop()
        texts["daemon log"] = d.output()
        texts.update(outputs(d, tmp_path, state_dir))
        assert "ftp://***@h/metrics" in texts["daemon log"]
        leaks = {(field, where) for field, secret in s.items()
                 for where, text in texts.items() if secret in text}
        assert leaks == set()
        if not dry_run:
            assert any("/snapshots/" in name for name in texts), sorted(texts)
    finally:
        engine.close()
