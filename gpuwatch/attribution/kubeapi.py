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
from dataclasses import dataclass, field

from gpuwatch.attribution.config import CA_FILE, TOKEN_FILE

MAX_RESPONSE_BYTES = 32 * 1024 * 1024
MAX_TOKEN_BYTES = 64 * 1024
_RUNTIME_ID = re.compile(r"^[a-z0-9-]{1,32}://(?P<id>[0-9a-f]{64})$")


class KubeApiUnavailable(Exception):
    """No answer from the API server; the message says why (never the token)."""


@dataclass(frozen=True)
class PodMeta:
    namespace: str
    name: str
    uid: str
    labels: dict[str, str] = field(default_factory=dict)  # allow-listed only
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
                   timeout: float = 5.0) -> list[PodMeta]:
    """The pods scheduled on `node`; raises KubeApiUnavailable with the reason."""
    import urllib.error  # with http.client and e-mail parsing: only where the API is used
    import urllib.request

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise KubeApiUnavailable(f"API server URL {url!r} is not http(s)://HOST[:PORT]")
    if not node:
        raise KubeApiUnavailable("node_name is not set (the downward API's spec.nodeName)")
    headers = {"Accept": "application/json"}
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if parts.scheme == "https":
        headers["Authorization"] = f"Bearer {_read_token(token_file)}"
        ctx = ssl.create_default_context(cafile=ca_file if os.path.exists(ca_file) else None)
        handlers.append(urllib.request.HTTPSHandler(context=ctx))
    # plain http: only `kubectl proxy`-style endpoints that authenticate themselves; the
    # token never travels unencrypted.
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}"})
    request = urllib.request.Request(f"{url.rstrip('/')}/api/v1/pods?{query}", headers=headers)
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=timeout) as resp:
            body = resp.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        hint = " (RBAC: the service account needs list on pods)" if exc.code == 403 else ""
        raise KubeApiUnavailable(f"API server answered HTTP {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise KubeApiUnavailable(f"API server unreachable: {reason}") from None
    if len(body) > MAX_RESPONSE_BYTES:
        raise KubeApiUnavailable(f"pod list larger than {MAX_RESPONSE_BYTES} bytes")
    try:
        return _parse(json.loads(body), allow_labels)
    except (ValueError, TypeError, AttributeError) as exc:
        raise KubeApiUnavailable(f"unexpected pod list: {type(exc).__name__}") from None


def _parse(doc: dict, allow_labels: tuple[str, ...]) -> list[PodMeta]:
    out = []
    for item in doc.get("items") or ():
        meta = item.get("metadata") or {}
        status = item.get("status") or {}
        labels = meta.get("labels") or {}
        containers = {}
        for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(key) or ():
                m = _RUNTIME_ID.match(str(cs.get("containerID") or ""))
                if m and isinstance(cs.get("name"), str):
                    containers[m["id"]] = cs["name"][:253]
        out.append(PodMeta(
            namespace=str(meta.get("namespace", ""))[:253], name=str(meta.get("name", ""))[:253],
            uid=str(meta.get("uid", "")).lower()[:64],
            labels={k: str(labels[k])[:63] for k in allow_labels if k in labels},
            containers=containers))
    return out
