"""The Helm chart through Helm's own engine (helm-python-sdk: Helm v4's Go SDK, called in
process): lint, renders with default values and with every toggle on, every rendered object
against the Kubernetes 1.31 schemas (kubernetes-validate), the operator's objects against the
shapes the Prometheus Operator accepts (and the rules through promtool), and the raw manifests
in exporters/kubernetes/ held to the default render."""

from __future__ import annotations

import re
import shutil
import ssl
import subprocess
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml

helm_python = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

from gpuwatch import __version__  # noqa: E402
from gpuwatch.cli import main as cli_main  # noqa: E402
from gpuwatch.config import load  # noqa: E402
from gpuwatch.monitoring import chart, dashboards, rules  # noqa: E402
from tests.helpers import Daemon, require_binary  # noqa: E402
from tests.test_deploy_files import CAPABILITIES  # noqa: E402
from tests.tls_certs import CA  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / chart.CHART
K8S_VERSION = "1.31"
TOKEN = "chart-webhook-token-0123456789"
ALL_ON = {
    "serviceMonitor": {"enabled": True, "metricRelabelings": [
        {"sourceLabels": ["__name__"], "regex": "gpuwatch_build_info", "action": "drop"}]},
    "tlsServerConfig": {"enabled": True, "existingSecret": "gpuwatch-tls",
                        "clientAuthType": "RequireAndVerifyClientCert"},
    "basicAuth": {"users": {"prometheus": "s3cret-scrape"}},
    "kubernetes": {"enablePodLabels": True, "podLabelAllowlistRegex": ["app\\.kubernetes\\.io/.*"],
                   "podAnnotationAllowlist": ["example.com/model"],
                   "rbac": {"nodesProxy": True}},
    "prometheusRule": {"enabled": True},
    "dashboards": {"enabled": True, "annotations": {"grafana_folder": "GPUs"}},
    "webhook": {"enabled": True, "token": TOKEN},
    "nvsentinel": {"enabled": True},
    "nodeProblemDetector": {"configMap": True},
    "podLabels": {"team": "ml-platform"},
    "extraEnv": [{"name": "GPUWATCH_LOG_LEVEL", "value": "info"}],
}
# What dcgm-exporter's users set (its chart's values): the same names here.
DCGM_EXPORTER_NAMES = [
    "serviceMonitor.enabled", "serviceMonitor.interval", "serviceMonitor.scrapeTimeout",
    "serviceMonitor.honorLabels", "serviceMonitor.relabelings", "serviceMonitor.metricRelabelings",
    "serviceMonitor.additionalLabels", "tlsServerConfig.enabled", "tlsServerConfig.existingSecret",
    "tlsServerConfig.clientAuthType", "tlsServerConfig.certFilename", "tlsServerConfig.keyFilename",
    "tlsServerConfig.caFilename", "basicAuth.users", "kubernetes.enablePodLabels",
    "kubernetes.podLabelAllowlistRegex", "kubernetes.rbac.create", "priorityClassName",
    "resources", "hostPID", "nodeSelector", "affinity", "tolerations", "kubeletPath",
    "runtimeClassName", "podLabels", "podAnnotations", "extraEnv", "imagePullSecrets",
    "image.repository", "image.tag", "image.pullPolicy", "securityContext",
    "podSecurityContext", "serviceAccount.create", "serviceAccount.name", "nameOverride",
    "fullnameOverride", "namespaceOverride", "rollingUpdate.maxUnavailable",
]


def objects(rendered: dict[str, str]) -> list[dict]:
    return [d for path, text in rendered.items() if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


@pytest.fixture(scope="module")
def default() -> dict[str, str]:
    return chart.render(CHART)


@pytest.fixture(scope="module")
def all_on() -> dict[str, str]:
    return chart.render(CHART, ALL_ON)


def test_helm_lint_passes_strict():
    for values in ({}, ALL_ON):
        result = helm_python.lint(str(CHART), values, strict=True, namespace="gpuwatch",
                                  kube_version=f"v{K8S_VERSION}.0")
        assert result["errors"] == [], result
        # INFO (1) is all there may be: no warning (2) or error (3)
        assert all(m["severity"] <= 1 for m in result["messages"]), result["messages"]


def test_lint_fails_on_a_broken_chart(tmp_path):
    broken = tmp_path / "gpuwatch"
    shutil.copytree(CHART, broken)
    path = broken / "templates" / "service.yaml"
    path.write_text(path.read_text().replace("{{- end }}", "", 1))
    assert helm_python.lint(str(broken), strict=True)["errors"]


@pytest.mark.parametrize("which", ["default", "all_on"])
def test_every_rendered_object_validates_against_kubernetes_1_31(which, request):
    objs = objects(request.getfixturevalue(which))
    core = [o for o in objs if not o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert len(core) >= (4 if which == "default" else 14)
    for obj in core:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_schema_check_can_fail(default):
    ds = by_kind(objects(default), "DaemonSet")[0]
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilitiez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


def test_exporters_kubernetes_is_the_default_render():
    on_disk = {p.name: p.read_text() for p in (REPO / chart.RAW).glob("*.yaml")}
    assert on_disk == chart.raw_manifests(CHART), (
        "exporters/kubernetes/ drifted from the chart: python -m gpuwatch.monitoring.chart")


def test_chart_files_and_readme_are_generated():
    for rel, text in chart.files().items():
        assert (CHART / rel).read_text() == text, f"{rel}: python -m gpuwatch.monitoring.chart"
    assert (CHART / "README.md").read_text() == chart.readme(CHART)
    assert (REPO / chart.NPD_FILE).read_text() == chart.files()[
        "files/npd/gpuwatch-custom-plugin-monitor.json"]


def test_readme_documents_every_value():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    documented = {k for k, _, _ in chart.values_table((CHART / "values.yaml").read_text())}

    def leaves(d, prefix=""):
        for k, v in d.items():
            key = prefix + k
            if isinstance(v, dict) and v and key not in documented:
                yield from leaves(v, key + ".")
            else:
                yield key
    assert set(leaves(values)) <= documented
    assert set(DCGM_EXPORTER_NAMES) <= documented


def test_values_table_reads_only_doc_comments():
    text = ("# Plain, mentioning\n# --web-config as a flag.\na:\n  # -- Documented\n"
            "  # over two lines.\n  b: 1\n")
    assert chart.values_table(text) == [("a.b", "1", "Documented over two lines.")]
    rows = chart.values_table((CHART / "values.yaml").read_text())
    keys = [k for k, _, _ in rows]
    # a row is a whole value or one of its leaves, never both
    assert not [k for k in keys if any(o.startswith(k + ".") for o in keys)]


def test_versions_and_image_tag_follow_gpuwatch(default):
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["version"] == meta["appVersion"] == __version__
    (ds,) = by_kind(objects(default), "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f":{__version__}")


def test_security_context_is_no_wider_than_the_systemd_unit(default, all_on):
    for rendered in (default, all_on):
        (ds,) = by_kind(objects(rendered), "DaemonSet")
        (c,) = ds["spec"]["template"]["spec"]["containers"]
        sc = c["securityContext"]
        added = {f"CAP_{x}" for x in sc["capabilities"]["add"]}
        assert added <= CAPABILITIES and sc["capabilities"]["drop"] == ["ALL"]
        assert sc["allowPrivilegeEscalation"] is False  # NoNewPrivileges=yes
        assert sc["privileged"] is False and sc["readOnlyRootFilesystem"] is True
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}  # SystemCallFilter=
        spec = ds["spec"]["template"]["spec"]
        assert not spec.get("hostNetwork") and not spec.get("hostIPC")
        writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
        # ReadWritePaths of the unit: state, probes (and the NVSentinel socket when asked)
        assert writable <= {"/var/lib/gpuwatch", "/run/gpuwatch", "/var/run/nvsentinel"}


def test_defaults_run_the_daemon_on_gpu_nodes_with_the_rendered_config(default, tmp_path):
    objs = objects(default)
    (ds,) = by_kind(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical" and spec["hostPID"] is True
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["automountServiceAccountToken"] is False  # no token without pod labels
    (c,) = spec["containers"]
    ctx = cli_main.commands["run"].make_context("run", list(c["args"]))
    assert ctx.params["listen"] == ":19400" and ctx.params["require_gpu"] is True
    assert not by_kind(objs, "ClusterRole") and not by_kind(objs, "Secret")
    assert not by_kind(objs, "PrometheusRule")  # off by default, as dcgm-exporter's is


def test_all_toggles_on_render_what_each_asks_for(all_on, tmp_path):
    objs = objects(all_on)
    kinds = sorted({o["kind"] for o in objs})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet",
                     "PrometheusRule", "Secret", "Service", "ServiceAccount", "ServiceMonitor"]
    (ds,) = by_kind(objs, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert spec["automountServiceAccountToken"] is True
    assert ds["spec"]["template"]["metadata"]["labels"]["team"] == "ml-platform"
    env = {e["name"]: e for e in c["env"]}
    assert env["GPUWATCH_ATTRIBUTION_KUBELET_NODE_ADDRESS"]["valueFrom"]["fieldRef"][
        "fieldPath"] == "status.hostIP"
    assert env["GPUWATCH_NVSENTINEL_NODE_NAME"]["valueFrom"]["fieldRef"][
        "fieldPath"] == "spec.nodeName"
    assert env["GPUWATCH_WEBHOOK_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    # with basic auth or required client certificates the kubelet's probes cannot
    # authenticate: they check the port
    assert "tcpSocket" in c["livenessProbe"] and "tcpSocket" in c["readinessProbe"]
    (role,) = by_kind(objs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/pods", "nodes/proxy"],
                              "verbs": ["get"]}]  # never pods: no API-server LIST
    (binding,) = by_kind(objs, "ClusterRoleBinding")
    (sa,) = by_kind(objs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "gpuwatch"}]
    secrets = {s["metadata"]["name"]: s for s in by_kind(objs, "Secret")}
    assert secrets["gpuwatch-webhook"]["stringData"]["token"] == TOKEN
    svc = {s["metadata"]["name"]: s for s in by_kind(objs, "Service")}
    assert svc["gpuwatch-webhook"]["spec"]["ports"][0]["targetPort"] == "metrics"
    # the rendered gpuwatch.toml (with the chart's kubelet and NVSentinel sections) loads
    cm = next(o for o in by_kind(objs, "ConfigMap") if "gpuwatch.toml" in o["data"])
    path = tmp_path / "gpuwatch.toml"
    path.write_text(cm["data"]["gpuwatch.toml"])
    cfg = load(path, environ={})
    assert cfg.attribution.kubelet.enabled and cfg.attribution.kubelet.port == 10250
    assert cfg.attribution.kubelet.pod_label_allowlist_regex == ["app\\.kubernetes\\.io/.*"]
    assert cfg.attribution.kubelet.pod_annotations == ["example.com/model"]
    assert cfg.nvsentinel.enabled


def service_links(services: list[dict]) -> dict[str, str]:
    """What the kubelet puts in a pod's environment for each Service of its namespace unless
    enableServiceLinks is false (pkg/kubelet/envvars): GPUWATCH_SERVICE_HOST for gpuwatch."""
    env = {}
    for i, svc in enumerate(services):
        name = svc["metadata"]["name"].upper().replace("-", "_")
        ip = f"10.96.0.{10 + i}"
        (first, *_) = ports = svc["spec"]["ports"]
        env[f"{name}_SERVICE_HOST"] = ip
        env[f"{name}_SERVICE_PORT"] = str(first["port"])
        env[f"{name}_PORT"] = f"tcp://{ip}:{first['port']}"
        for p in ports:
            env[f"{name}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(p["port"])
            base = f"{name}_PORT_{p['port']}_TCP"
            env.update({base: f"tcp://{ip}:{p['port']}", f"{base}_PROTO": "tcp",
                        f"{base}_PORT": str(p["port"]), f"{base}_ADDR": ip})
    return env


@pytest.mark.parametrize("which", ["default", "all_on"])
def test_no_service_links_in_the_daemons_environment(which, request, tmp_path, caplog):
    """The kubelet would name the chart's Services' addresses GPUWATCH_SERVICE_HOST,
    GPUWATCH_WEBHOOK_PORT_19400_TCP, ...: the prefix of gpuwatch's settings. The pod turns
    service links off; were they on, the daemon's configuration would still be the same."""
    objs = objects(request.getfixturevalue(which))
    (ds,) = by_kind(objs, "DaemonSet")
    assert ds["spec"]["template"]["spec"]["enableServiceLinks"] is False
    links = service_links(by_kind(objs, "Service"))
    assert "GPUWATCH_SERVICE_HOST" in links and "GPUWATCH_PORT_19400_TCP_ADDR" in links
    if which == "all_on":
        assert "GPUWATCH_WEBHOOK_SERVICE_PORT_WEBHOOK" in links
    cm = next(o for o in by_kind(objs, "ConfigMap") if "gpuwatch.toml" in o["data"])
    path = tmp_path / "gpuwatch.toml"
    path.write_text(cm["data"]["gpuwatch.toml"])
    with caplog.at_level("WARNING", logger="gpuwatch.config"):
        assert load(path, environ=links) == load(path, environ={})
    assert "GPUWATCH_SERVICE_HOST: not a gpuwatch setting, ignored" in caplog.text


def test_nodes_proxy_only_when_asked_or_on_old_kubelets():
    values = {"kubernetes": {"enablePodLabels": True, "rbac": {"nodesProxy": False}}}
    (role,) = by_kind(objects(chart.render(CHART, values)), "ClusterRole")
    assert role["rules"][0]["resources"] == ["nodes/pods"]


def test_probes_use_https_with_tls_alone():
    values = {"tlsServerConfig": {"enabled": True, "existingSecret": "tls"}}
    (ds,) = by_kind(objects(chart.render(CHART, values)), "DaemonSet")
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    with pytest.raises(helm_python.HelmError, match="existingSecret is required"):
        chart.render(CHART, {"tlsServerConfig": {"enabled": True}})
    with pytest.raises(helm_python.HelmError, match=r"webhook\.token"):
        chart.render(CHART, {"webhook": {"enabled": True}})


def test_prometheus_rule_has_a_toggle_per_generated_group(all_on, tmp_path):
    (rule,) = by_kind(objects(all_on), "PrometheusRule")
    generated = rules.prometheus_rule(rules.RuleParams())["spec"]["groups"]
    assert rule["spec"]["groups"] == generated
    toggles = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["groups"]
    assert len(toggles) == len(generated)
    for key in toggles:
        values = {"prometheusRule": {"enabled": True, "groups": {key: False}}}
        (one_off,) = by_kind(objects(chart.render(CHART, values)), "PrometheusRule")
        left = [g["name"] for g in one_off["spec"]["groups"]]
        assert len(left) == len(generated) - 1, key
    # what the operator hands Prometheus is a rule file promtool accepts
    promtool = require_binary("promtool")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


# The Prometheus Operator's v1 shapes for what the chart sets (its CRDs' openAPIV3Schema).
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                      r"(([0-9]+)s)?(([0-9]+)ms)?)$")
ENDPOINT_KEYS = {"port", "path", "interval", "scrapeTimeout", "honorLabels", "scheme",
                 "relabelings", "metricRelabelings", "tlsConfig", "basicAuth"}
RELABEL_KEYS = {"sourceLabels", "separator", "targetLabel", "regex", "modulus", "replacement",
                "action"}
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}


def operator_problems(obj: dict) -> list[str]:
    out = []
    spec = obj.get("spec") or {}
    if obj["kind"] == "ServiceMonitor":
        if set(spec) - {"jobLabel", "namespaceSelector", "selector", "endpoints"}:
            out.append(f"spec keys {set(spec)}")
        if not spec.get("selector", {}).get("matchLabels"):
            out.append("no selector")
        for ep in spec.get("endpoints") or [None]:
            if not isinstance(ep, dict) or set(ep) - ENDPOINT_KEYS or not ep.get("port"):
                out.append(f"endpoint {ep}")
                continue
            out += [f"{k}: {ep[k]}" for k in ("interval", "scrapeTimeout")
                    if k in ep and not DURATION.match(str(ep[k]))]
            if not isinstance(ep.get("honorLabels", False), bool):
                out.append("honorLabels")
            for r in ep.get("relabelings", []) + ep.get("metricRelabelings", []):
                if set(r) - RELABEL_KEYS:
                    out.append(f"relabeling {r}")
    elif obj["kind"] == "PrometheusRule":
        names = [g.get("name") for g in spec.get("groups") or []]
        if len(set(names)) != len(names) or not all(names):
            out.append(f"group names {names}")
        for g in spec.get("groups") or []:
            for r in g.get("rules") or []:
                if (set(r) - RULE_KEYS or "expr" not in r
                        or ("alert" in r) == ("record" in r)):
                    out.append(f"rule {r}")
                if "for" in r and not DURATION.match(r["for"]):
                    out.append(f"for {r['for']}")
                for k in ("labels", "annotations"):
                    if not all(isinstance(v, str) for v in (r.get(k) or {}).values()):
                        out.append(f"{k} of {r.get('alert')}")
    if not obj["metadata"].get("namespace") or not obj["metadata"].get("labels"):
        out.append("metadata")
    return out


@pytest.mark.parametrize("which", ["default", "all_on"])
def test_operator_objects_have_the_operators_shapes(which, request):
    objs = [o for o in objects(request.getfixturevalue(which))
            if o["apiVersion"] == "monitoring.coreos.com/v1"]
    assert {o["kind"] for o in objs} == (
        {"ServiceMonitor"} if which == "default" else {"ServiceMonitor", "PrometheusRule"})
    for o in objs:
        assert operator_problems(o) == [], o["kind"]
    bad = {"kind": "ServiceMonitor", "metadata": {"namespace": "x", "labels": {"a": "b"}},
           "spec": {"selector": {"matchLabels": {"a": "b"}},
                    "endpoints": [{"port": "metrics", "interval": "15 seconds"}]}}
    assert operator_problems(bad)


def test_service_monitor_selects_the_service_and_keeps_job_gpuwatch():
    values = {"serviceMonitor": {"interval": "30s", "honorLabels": True,
                                 "additionalLabels": {"release": "monitoring"}}}
    objs = objects(chart.render(CHART, values, name="gpu-obs", namespace="observability"))
    (mon,) = by_kind(objs, "ServiceMonitor")
    (svc,) = by_kind(objs, "Service")
    assert svc["metadata"]["name"] == "gpu-obs-gpuwatch"
    assert mon["metadata"]["labels"]["release"] == "monitoring"
    assert mon["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert mon["spec"]["namespaceSelector"]["matchNames"] == ["observability"]
    # the job label is the Service's app.kubernetes.io/name: the shipped rules' job="gpuwatch"
    assert svc["metadata"]["labels"][mon["spec"]["jobLabel"]] == rules.RuleParams().job
    (ep,) = mon["spec"]["endpoints"]
    assert (ep["interval"], ep["honorLabels"], ep["port"]) == ("30s", True, "metrics")


def test_dashboards_are_configmaps_for_the_grafana_sidecar(all_on):
    maps = [o for o in by_kind(objects(all_on), "ConfigMap")
            if o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = dashboards.render()
    assert {k for m in maps for k in m["data"]} == set(shipped)
    for m in maps:
        ((name, text),) = m["data"].items()
        assert text == shipped[name].rstrip("\n")
        assert m["metadata"]["annotations"] == {"grafana_folder": "GPUs"}


def test_npd_configmap_carries_the_shipped_monitor(all_on):
    import json

    (cm,) = [o for o in by_kind(objects(all_on), "ConfigMap") if o["metadata"]["name"]
             == "gpuwatch-npd"]
    doc = json.loads(cm["data"]["gpuwatch-custom-plugin-monitor.json"])
    assert {c["type"] for c in doc["conditions"]} == {"GpuwatchGpuUnhealthy",
                                                      "GpuwatchGpuMemoryPressure"}


def test_rendered_web_config_serves_tls_and_basic_auth_from_the_values(all_on, tmp_path):
    """The Secret the chart renders, with certificates where the DaemonSet mounts them, is a
    web configuration the daemon serves: mTLS, and the password from basicAuth.users."""
    objs = objects(all_on)
    (secret,) = [s for s in by_kind(objs, "Secret")
                 if s["metadata"]["name"] == "gpuwatch-web-config"]
    text = secret["stringData"]["web-config.yml"]
    doc = yaml.safe_load(text)
    hashed = doc["basic_auth_users"]["prometheus"].encode()
    assert bcrypt.checkpw(b"s3cret-scrape", hashed) and not bcrypt.checkpw(b"wrong", hashed)
    ca = CA(tmp_path, "ca")
    crt, key = ca.issue("tls", server=True)
    client = ca.issue("client", server=False)
    tls = tmp_path / "gpuwatch-tls"
    tls.mkdir()
    for src, name in ((crt, "tls.crt"), (key, "tls.key"), (ca.crt, "ca.crt")):
        shutil.copy(src, tls / name)
    web = tmp_path / "web-config.yml"
    web.write_text(text.replace("/etc/gpuwatch-tls/", f"{tls}/"))
    d = Daemon(tmp_path, "--simulate", "steady", "--web-config", str(web), wait_ready=False)
    try:
        ctx = ssl.create_default_context(cafile=str(ca.crt))
        ctx.load_cert_chain(str(client[0]), str(client[1]))
        url = f"https://127.0.0.1:{d.port}/api/state"

        def get(password: str | None) -> int:
            req = urllib.request.Request(url)
            if password:
                import base64
                cred = base64.b64encode(f"prometheus:{password}".encode()).decode()
                req.add_header("Authorization", f"Basic {cred}")
            try:
                with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        from tests.helpers import wait_until

        def answers():
            if not d.alive():
                raise RuntimeError(d.output())
            try:
                return get("s3cret-scrape") == 200
            except OSError:
                return False
        wait_until(answers, 30, what="daemon over mTLS")
        assert get(None) == 401 and get("wrong") == 401
    finally:
        d.stop()
