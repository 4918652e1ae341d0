"""Optional, off by default: the pods of this node from the Kubernetes API server. It names
pod UIDs and container ids exactly (no matching through GPUs) and gives the pod labels an
allow-list selects. Needs a service-account token with RBAC `list` on `pods` (see
docs/attribution.md), or `kubectl proxy` on loopback (plain HTTP, no token sent).

The token is read from its file at each call, sent only over HTTPS, and never logged or
shown; the response is bounded in size and time.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuwatch.attribution.config import CA_FILE, TOKEN_FILE

MAX_RESPONSE_BYTES = 32 * 1024 * 1024
MAX_TOKEN_BYTES = 64 * 1024
MAX_POD_LABELS = 16
MAX_ANNOTATION_VALUE = 128
_RUNTIME_ID = re.compile(r"^[a-z0-9-]{1,32}://(?P<id>[0-9a-f]{64})$")


class KubeApiUnavailable(Exception):
    """No answer from the API server; the message says why (never the token)."""


@dataclass(frozen=True)
class PodMeta:
    namespace: str
    name: str
    uid: str
    labels: dict[str, str] = field(default_factory=dict)  # allow-listed only
    annotations: dict[str, str] = field(default_factory=dict)  # allow-listed only
    containers: dict[str, str] = field(default_factory=dict)  # container id -> name


def default_url(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host:
        return ""
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port or 443}"


def _read_token(path: str) -> str:
    try:
        with open(path, "rb") as f:
            token = f.read(MAX_TOKEN_BYTES).strip()
    except OSError as exc:
        raise KubeApiUnavailable(f"no service-account token at {path} ({exc.strerror})"
                                 ) from None
    if not token or not all(33 <= b < 127 for b in token):
        raise KubeApiUnavailable(f"the token in {path} is empty or not printable")
    return token.decode()


def list_node_pods(url: str, node: str, *, token_file: str = TOKEN_FILE,
                   ca_file: str = CA_FILE, allow_labels: tuple[str, ...] = (),
                   allow_annotations: tuple[str, ...] = (),
                   timeout: float = 5.0) -> list[PodMeta]:
    """The pods scheduled on `node`; raises KubeApiUnavailable with the reason."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise KubeApiUnavailable(f"API server URL {url!r} is not http(s)://HOST[:PORT]")
    if not node:
        raise KubeApiUnavailable("node_name is not set (the downward API's spec.nodeName)")
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}"})
    doc = fetch_json(f"{url.rstrip('/')}/api/v1/pods?{query}", "API server",
                     token_file=token_file, ca_file=ca_file, timeout=timeout,
                     forbidden="the service account needs list on pods")
    return parse_pods(doc, select_labels(allow_labels), allow_annotations)


def fetch_json(url: str, who: str, *, token_file: str, ca_file: str, timeout: float,
               forbidden: str, verify: bool = True):
    """GET a JSON document with the service-account token (HTTPS only); bounded in size and
    time. Raises KubeApiUnavailable naming `who` and the reason, never the token."""
    import urllib.error  # with http.client and e-mail parsing: only where it is used
    import urllib.request

    headers = {"Accept": "application/json"}
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https:"):
        headers["Authorization"] = f"Bearer {_read_token(token_file)}"
        if verify:
            ctx = ssl.create_default_context(
                cafile=ca_file if os.path.exists(ca_file) else None)
        else:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        handlers.append(urllib.request.HTTPSHandler(context=ctx))
    # plain http: only `kubectl proxy`-style endpoints that authenticate themselves; the
    # token never travels unencrypted.
    request = urllib.request.Request(url, headers=headers)
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout) as resp:
            body = resp.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        hint = f" (RBAC: {forbidden})" if exc.code == 403 else ""
        raise KubeApiUnavailable(f"{who} answered HTTP {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise KubeApiUnavailable(f"{who} unreachable: {reason}") from None
    if len(body) > MAX_RESPONSE_BYTES:
        raise KubeApiUnavailable(f"pod list larger than {MAX_RESPONSE_BYTES} bytes")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise KubeApiUnavailable(f"unexpected pod list: {type(exc).__name__}") from None


def select_labels(exact: tuple[str, ...] = (), patterns: tuple[str, ...] = ()
                  ) -> Callable[[dict], dict[str, str]]:
    """The allow-listed labels of one pod: exact keys, then keys a pattern matches in full;
    at most MAX_POD_LABELS (each is a label on every process series)."""
    compiled = [re.compile(p) for p in patterns]

    def select(labels: dict) -> dict[str, str]:
        keys = [k for k in exact if k in labels]
        keys += [k for k in sorted(labels) if isinstance(k, str) and k not in keys
                 and any(c.fullmatch(k) for c in compiled)]
        return {k: str(labels[k])[:63] for k in keys[:MAX_POD_LABELS]}
    return select


def parse_pods(doc, select: Callable[[dict], dict[str, str]],
               annotations: tuple[str, ...] = ()) -> list[PodMeta]:
    """A PodList (the API server's and the kubelet's /pods are the same shape); `annotations`
    names the annotations kept."""
    try:
        return _parse(doc, select, annotations)
    except (ValueError, TypeError, AttributeError) as exc:
        raise KubeApiUnavailable(f"unexpected pod list: {type(exc).__name__}") from None


def _parse(doc: dict, select: Callable[[dict], dict[str, str]],
           annotation_keys: tuple[str, ...]) -> list[PodMeta]:
    out = []
    for item in doc.get("items") or ():
        meta = item.get("metadata") or {}
        status = item.get("status") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if not isinstance(annotations, dict):
            annotations = {}
        containers = {}
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(key) or ():
                m = _RUNTIME_ID.match(str(cs.get("containerID") or ""))
                if m and isinstance(cs.get("name"), str):
                    containers[m["id"]] = cs["name"][:253]
        out.append(PodMeta(
            namespace=str(meta.get("namespace", ""))[:253], name=str(meta.get("name", ""))[:253],
            uid=str(meta.get("uid", "")).lower()[:64],
            labels=select(labels) if isinstance(labels, dict) else {},
            annotations={k: str(annotations[k])[:MAX_ANNOTATION_VALUE]
                         for k in annotation_keys if k in annotations},
            containers=containers))
    return out
