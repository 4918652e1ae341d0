"""Settings of process attribution (pods, containers, Slurm jobs)."""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from gpuwatch.attribution.podresources import DEFAULT_SOCKET

TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
# a label key: optional DNS-subdomain prefix, then a name of 1-63 characters
LABEL_KEY = re.compile(r"^(?:[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class KubernetesApiConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Off by default: pod metadata from the API server (RBAC: list pods). One LIST per node
    per refresh: prefer [attribution.kubelet], which costs the API server no LIST."""

    enabled: bool = False
    # "" = https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (in-cluster)
    url: str = ""
    # This node's name, from the downward API (GPUWATCH_ATTRIBUTION_KUBERNETES_API_NODE_NAME).
    node_name: str = ""
    token_file: str = TOKEN_FILE
    ca_file: str = CA_FILE
    # Pod labels copied onto gpuwatch_process_info as label_<key>, e.g. app.kubernetes.io/name
    pod_labels: list[str] = []
    # Pod annotations copied as annotation_<key> (exact keys)
    pod_annotations: list[str] = []

    def __post_init__(self) -> None:
        _check_labels(self.pod_labels, [], self.pod_annotations)


def _check_labels(exact: list[str], patterns: list[str], annotations: list[str]) -> None:
    # annotation keys have the label keys' syntax
    for name, keys in (("pod_labels", exact), ("pod_annotations", annotations)):
        bad = [k for k in keys if not LABEL_KEY.match(k)]
        if bad:
            raise ValueError(f"{name}: {bad[0]!r} is not a Kubernetes label key")
    if len(exact) + len(patterns) + len(annotations) > 16:
        raise ValueError("pod_labels, pod_label_allowlist_regex and pod_annotations: at most "
                         "16 together (each is a label on every process series)")
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"pod_label_allowlist_regex: {p!r}: {exc}") from None


class KubeletConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Off by default: pod labels from this node's kubelet (GET /pods on its authenticated
    port; RBAC get on nodes/pods, or nodes/proxy before 1.33). No API-server LIST."""

    enabled: bool = False
    # "" = https://<node_address>:<port>
    url: str = ""
    # The node's address, from the downward API's status.hostIP
    # (GPUWATCH_ATTRIBUTION_KUBELET_NODE_ADDRESS).
    node_address: str = ""
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 10250
    token_file: str = TOKEN_FILE
    ca_file: str = CA_FILE
    # Kubelets without serverTLSBootstrap serve a self-signed certificate.
    insecure_skip_tls_verify: bool = False
    # Pod labels copied onto gpuwatch_process_info as label_<key>: exact keys, and keys a
    # regular expression matches in full (at most 16 labels per pod).
    pod_labels: list[str] = []
    pod_label_allowlist_regex: list[str] = []
    # Pod annotations copied as annotation_<key> (exact keys; values cut at 128 characters).
    pod_annotations: list[str] = []

    def __post_init__(self) -> None:
        _check_labels(self.pod_labels, self.pod_label_allowlist_regex, self.pod_annotations)


class AttributionConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = True
    # The kubelet's pod-resources socket; "" turns the Kubernetes join off.
    podresources_socket: str = DEFAULT_SOCKET
    # Pods and jobs change slowly: re-read them on this interval, not every tick (a new
    # process is looked up at its first sample, at most every min_refresh_seconds).
    refresh_seconds: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    min_refresh_seconds: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=30)] = 2.0
    # `gpuwatch attribution` shows SLURM_JOB_ID from /proc/<pid>/environ (root only) as
    # slurm_job_id_self_reported when the cgroup names no job; never a label: anyone sets it.
    slurm_environ: bool = True
    # dcgm-exporter's HPC job-mapping directory (files named by GPU index list its jobs).
    hpc_job_mapping_dir: str = ""
    kubelet: KubeletConfig = msgspec.field(default_factory=KubeletConfig)
    kubernetes_api: KubernetesApiConfig = msgspec.field(default_factory=KubernetesApiConfig)
