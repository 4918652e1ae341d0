"""Deployment files work as written: systemd-analyze verifies the unit under a root laid out
like the README's install, promtool checks the Prometheus configuration where it stands, and
the Kubernetes objects carry their required fields and agree with each other and the CLI."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuwatch import __version__, exitcodes
from gpuwatch.cli import main as cli_main
from gpuwatch.config import DEFAULT_PORT, load
from gpuwatch.probe_channel.config import SYSTEM_DIR
from tests.helpers import require_binary
from tests.test_readme import blocks

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "exporters"
UNIT = ROOT / "gpuwatch.service"
VENV_BIN = "/opt/gpuwatch/bin/gpuwatch"
CAPABILITIES = {"CAP_KILL", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_DAC_OVERRIDE",
                "CAP_FOWNER", "CAP_CHOWN"}

# Required fields by kind (dotted paths; [] = every element of a list): what the API server
# rejects an object without.
REQUIRED = {
    "*": ["apiVersion", "kind", "metadata.name"],
    "DaemonSet": ["metadata.namespace", "spec.selector.matchLabels",
                  "spec.template.metadata.labels", "spec.template.spec.containers[].name",
                  "spec.template.spec.containers[].image"],
    "Service": ["metadata.namespace", "spec.selector", "spec.ports[].port"],
    "ConfigMap": ["metadata.namespace", "data"],
    "ServiceMonitor": ["metadata.namespace", "metadata.labels", "spec.selector.matchLabels",
                       "spec.endpoints[].port"],
    "PrometheusRule": ["metadata.namespace", "metadata.labels", "spec.groups[].name",
                       "spec.groups[].rules[].expr"],
}
API_VERSIONS = {"ServiceAccount": "v1", "DaemonSet": "apps/v1", "Service": "v1", "ConfigMap": "v1",
                "ServiceMonitor": "monitoring.coreos.com/v1",
                "PrometheusRule": "monitoring.coreos.com/v1"}


def missing(obj, path: str) -> list[str]:
    head, _, rest = path.partition(".")
    many = head.endswith("[]")
    key = head.removesuffix("[]")
    if not isinstance(obj, dict) or obj.get(key) in (None, "", [], {}):
        return [path]
    value = obj[key]
    if not rest:
        return []
    items = value if many else [value]
    return [f"{key}.{m}" for item in items for m in missing(item, rest)]


def k8s(name: str) -> list[dict]:
    path = REPO / name
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# what charts/gpuwatch renders with default values (tests/test_chart.py holds them to it)
OBJECTS = {name: k8s(name) for name in (
    "exporters/kubernetes/daemonset.yaml", "exporters/kubernetes/configmap.yaml",
    "exporters/kubernetes/service.yaml", "exporters/kubernetes/serviceaccount.yaml",
    "exporters/kubernetes/servicemonitor.yaml", "alerts/gpuwatch.prometheusrule.yml")}


def one(kind: str) -> dict:
    (obj,) = [o for objs in OBJECTS.values() for o in objs if o["kind"] == kind]
    return obj


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_kubernetes_objects_have_their_required_fields(name):
    for obj in OBJECTS[name]:
        kind = obj.get("kind")
        assert kind in API_VERSIONS, f"{name}: unexpected kind {kind}"
        assert obj["apiVersion"] == API_VERSIONS[kind]
        problems = [m for p in REQUIRED["*"] + REQUIRED.get(kind, []) for m in missing(obj, p)]
        assert not problems, f"{name} {kind}: missing {problems}"


def test_operator_objects_live_in_their_own_files():
    # A cluster without the Prometheus Operator's CRDs can still apply these two.
    for name in ("exporters/kubernetes/daemonset.yaml", "exporters/kubernetes/service.yaml",
                 "exporters/kubernetes/configmap.yaml"):
        assert all(o["apiVersion"] != "monitoring.coreos.com/v1" for o in OBJECTS[name])
    mon, rule = one("ServiceMonitor"), one("PrometheusRule")
    assert mon["metadata"]["namespace"] == rule["metadata"]["namespace"] == "gpuwatch"
    assert mon["metadata"]["labels"]["release"] == rule["metadata"]["labels"]["release"]


def test_daemonset_runs_the_daemon_with_host_pid_probes_and_a_pinned_image():
    ds = one("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    assert ds["spec"]["selector"]["matchLabels"].items() <= (
        ds["spec"]["template"]["metadata"]["labels"].items())
    (c,) = spec["containers"]
    assert c["image"].rsplit(":", 1)[1] == __version__
    assert c["ports"][0]["containerPort"] == DEFAULT_PORT
    # The args are ones `gpuwatch run` accepts (the image's entrypoint is `gpuwatch run`).
    ctx = cli_main.commands["run"].make_context("run", list(c["args"]))
    assert ctx.params["listen"] == f":{DEFAULT_PORT}" and ctx.params["require_gpu"] is True
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    probe_mount = next(n for n, p in mounts.items() if SYSTEM_DIR.startswith(p + "/"))
    assert volumes[probe_mount]["hostPath"]["path"] == mounts[probe_mount]
    cm = one("ConfigMap")
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]


def test_configmap_config_loads(tmp_path):
    path = tmp_path / "gpuwatch.toml"
    path.write_text(one("ConfigMap")["data"]["gpuwatch.toml"])
    load(path, environ={})


def test_service_and_monitor_select_the_daemonset():
    ds, svc, mon = one("DaemonSet"), one("Service"), one("ServiceMonitor")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["port"] == DEFAULT_PORT
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in mon["spec"]["endpoints"]} <= {p["name"] for p in
                                                            svc["spec"]["ports"]}
    assert svc["metadata"]["namespace"] in mon["spec"]["namespaceSelector"]["matchNames"]


def test_daemonset_mounts_the_kubelet_pod_resources_socket_read_only():
    ds = next(d for d in k8s("exporters/kubernetes/daemonset.yaml") if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "pod-resources")
    volume = next(v for v in spec["volumes"] if v["name"] == "pod-resources")
    from gpuwatch.attribution.podresources import DEFAULT_SOCKET

    assert mount["readOnly"] is True
    assert DEFAULT_SOCKET.startswith(mount["mountPath"] + "/")
    assert volume["hostPath"]["path"] == mount["mountPath"]
    # grpcio (pod attribution) and opentelemetry-proto (OTLP push) in the image
    assert '".[kubernetes,otlp]"' in (ROOT / "Containerfile").read_text()


def test_containerfile_builds_the_pinned_tag():
    text = (ROOT / "Containerfile").read_text()
    assert f"EXPOSE {DEFAULT_PORT}" in text and 'ENTRYPOINT ["gpuwatch", "run"]' in text
    tags = set(re.findall(r"-t (\S+) \.", text))
    assert tags == {one("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]}
    for name in re.findall(r"^COPY (.+) \./", text, re.M)[0].split():
        assert (REPO / name).exists(), name


def test_the_container_keeps_the_units_hardening():
    """The unit's capabilities, no privilege gain and read-only system, in the image's run
    command and the DaemonSet alike."""
    caps = {c.removeprefix("CAP_") for c in set(unit()["CapabilityBoundingSet"][0].split())}
    text = (ROOT / "Containerfile").read_text()
    assert set(re.findall(r"--cap-add (\w+)", text)) == caps and "--cap-drop ALL" in text
    for flag in ("--security-opt no-new-privileges", "--read-only", "--pid=host"):
        assert flag in text, flag
    assert re.search(r"^FROM \$\{BASE\}$", text, re.M) and "python3-venv" in text
    (container,) = one("DaemonSet")["spec"]["template"]["spec"]["containers"]
    sc = container["securityContext"]
    assert set(sc["capabilities"]["add"]) == caps and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert unit()["NoNewPrivileges"] == ["yes"] and unit()["ProtectSystem"] == ["strict"]


def unit() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def test_systemd_unit_fits_the_documented_install():
    u = unit()
    run_cmd = blocks("sh")[0]
    assert VENV_BIN.replace("gpuwatch/bin/gpuwatch", "gpuwatch/bin/pip install") in run_cmd
    assert u["ExecStart"] == [f"{VENV_BIN} run --config /etc/gpuwatch/gpuwatch.toml"]
    # Config errors are not retried; a busy port (and everything else) is. A failed
    # ExecStartPre= would be retried whatever its status: the daemon checks at start itself.
    assert "ExecStartPre" not in u
    assert u["RestartPreventExitStatus"] == [str(exitcodes.USAGE)]
    assert u["Restart"] == ["on-failure"] and exitcodes.TEMPFAIL != exitcodes.USAGE
    assert "/etc/gpuwatch/gpuwatch.toml" in (ROOT / "gpuwatch.toml").read_text()
    # Hardening: only the named capabilities, each with its reason in a comment.
    assert set(u["CapabilityBoundingSet"][0].split()) == CAPABILITIES
    comments = "\n".join(line for line in UNIT.read_text().splitlines() if line.startswith("#"))
    assert all(cap in comments for cap in CAPABILITIES)
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict",
                       "DevicePolicy": "closed", "StateDirectory": "gpuwatch",
                       "LogsDirectory": "gpuwatch"}.items():
        assert u[key] == [value], key
    # The shipped config writes its events log where the unit lets it.
    assert load(ROOT / "gpuwatch.toml", environ={}).events_log.startswith("/var/log/gpuwatch/")


def test_systemd_unit_gives_the_connection_cap_and_the_reserve_their_descriptors():
    from gpuwatch.config import HttpConfig
    from gpuwatch.exporter.sockets import RESERVED_FDS

    limit = int(unit()["LimitNOFILE"][0])
    # With room for what the daemon itself holds open (threads, NVML, logs: ~50).
    assert limit >= HttpConfig().max_connections + RESERVED_FDS + 128
    # The container's run line asks for the same.
    assert f"--ulimit nofile={limit}:{limit}" in (ROOT / "Containerfile").read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_verify_accepts_the_unit(tmp_path):
    # A root laid out like a host after the README's install: systemd's own units, the venv's
    # command and kill(1). verify then checks the unit's keys, commands and dependencies.
    (tmp_path / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", tmp_path / "usr/lib/systemd/system",
                    symlinks=True)
    for exe in (VENV_BIN, "/bin/kill"):
        p = tmp_path / exe.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
    dest = tmp_path / "etc/systemd/system/gpuwatch.service"
    dest.parent.mkdir(parents=True)
    shutil.copy(UNIT, dest)
    r = subprocess.run(["systemd-analyze", "verify", f"--root={tmp_path}", str(dest)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_security_score_is_the_documented_one():
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(UNIT)],
                       capture_output=True, text=True, timeout=60)
    if "--offline" in r.stderr and r.returncode != 0:
        pytest.skip("this systemd-analyze has no --offline")
    m = re.search(r"Overall exposure level for gpuwatch.service: (\d+\.\d+) (\w+)", r.stdout)
    assert m, r.stdout[-500:] + r.stderr
    score = float(m[1])
    assert score <= 4.0, r.stdout  # was 9.0 UNSAFE before the hardening
    doc = (REPO / "docs" / "deployment.md").read_text()
    assert f"{m[1]} {m[2]}" in doc, "docs/deployment.md must record the current score"
    assert f"scores it {m[1]} {m[2]}" in UNIT.read_text(), "so must the unit's header"


def test_prometheus_config_passes_promtool_where_it_stands():
    promtool = require_binary("promtool")
    r = subprocess.run([promtool, "check", "config", "exporters/prometheus.yml"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 rule files found" in r.stdout
