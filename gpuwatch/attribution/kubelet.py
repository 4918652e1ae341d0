"""Pod metadata from this node's kubelet: GET /pods on its authenticated port (10250), with
the pod's service-account token. The kubelet answers from its own memory; the API server is
asked nothing but the kubelet's cached check of the token (TokenReview, SubjectAccessReview).

The kubelet authorizes /pods as nodes/pods (KubeletFineGrainedAuthz, 1.33 on) or nodes/proxy
(before). Its read-only port 10255 is off by default on managed clusters and is not used.
"""

from __future__ import annotations

import ipaddress

from gpuwatch.attribution.kubeapi import (
    KubeApiUnavailable,
    PodMeta,
    fetch_json,
    parse_pods,
    select_labels,
)


def kubelet_url(url: str, node_address: str, port: int) -> str:
    """The configured URL, else https://<node address>:<port>."""
    if url:
        return url.rstrip("/")
    if not node_address:
        raise KubeApiUnavailable("attribution.kubelet: node_address is not set (the downward "
                                 "API's status.hostIP) and no url is given")
    try:
        host = ipaddress.ip_address(node_address)
        shown = f"[{host}]" if host.version == 6 else str(host)
    except ValueError:
        shown = node_address
    return f"https://{shown}:{port}"


def list_pods(cfg, timeout: float = 5.0) -> list[PodMeta]:
    """This node's pods from its kubelet (cfg: a KubeletConfig); raises KubeApiUnavailable."""
    url = kubelet_url(cfg.url, cfg.node_address, cfg.port)
    doc = fetch_json(f"{url}/pods", "kubelet", token_file=cfg.token_file, ca_file=cfg.ca_file,
                     timeout=timeout, verify=not cfg.insecure_skip_tls_verify,
                     forbidden="the service account needs get on nodes/pods (nodes/proxy "
                               "before Kubernetes 1.33)")
    return parse_pods(doc, select_labels(tuple(cfg.pod_labels),
                                         tuple(cfg.pod_label_allowlist_regex)),
                      tuple(cfg.pod_annotations))
