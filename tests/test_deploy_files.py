"""Deployment examples stay consistent with the daemon (port, probes, flags)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuwatch.config import DEFAULT_PORT

ROOT = Path(__file__).resolve().parent.parent / "exporters"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "kubernetes" / name).read_text()) if d]


def test_daemonset_runs_the_daemon_with_host_pid_and_probes():
    ds = next(d for d in docs("daemonset.yaml") if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    (c,) = spec["containers"]
    assert c["ports"][0]["containerPort"] == DEFAULT_PORT
    assert f":{DEFAULT_PORT}" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_service_and_monitor_select_the_daemonset():
    svc, mon = docs("service.yaml")
    assert svc["spec"]["ports"][0]["port"] == DEFAULT_PORT
    assert mon["kind"] == "ServiceMonitor"
    assert mon["spec"]["selector"]["matchLabels"] == svc["metadata"]["labels"]


def test_systemd_unit_and_container_use_the_cli():
    unit = (ROOT / "gpuwatch.service").read_text()
    assert "ExecStart=/usr/local/bin/gpuwatch run" in unit
    assert "RestartPreventExitStatus=2" in unit  # configuration errors exit 2
    assert f"EXPOSE {DEFAULT_PORT}" in (ROOT / "Containerfile").read_text()


def test_daemonset_mounts_the_kubelet_pod_resources_socket_read_only():
    ds = next(d for d in docs("daemonset.yaml") if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "pod-resources")
    volume = next(v for v in spec["volumes"] if v["name"] == "pod-resources")
    from gpuwatch.attribution.podresources import DEFAULT_SOCKET

    assert mount["readOnly"] is True
    assert DEFAULT_SOCKET.startswith(mount["mountPath"] + "/")
    assert volume["hostPath"]["path"] == mount["mountPath"]
    assert '".[kubernetes]"' in (ROOT / "Containerfile").read_text()  # grpcio in the image


def test_attribution_rbac_grants_only_listing_pods():
    sa, role, binding = docs("attribution-rbac.yaml")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    assert (subject["name"], subject["namespace"]) == (sa["metadata"]["name"],
                                                       sa["metadata"]["namespace"])
    ds = next(d for d in docs("daemonset.yaml") if d["kind"] == "DaemonSet")
    assert sa["metadata"]["namespace"] == ds["metadata"]["namespace"]
