"""The Kubernetes API server, as `preflight kube-label` speaks to it, over the standard
library: a GET and a PATCH of one node and the node list, each with a deadline, the
service account's token read afresh each time over TLS with the cluster's CA, never
through a proxy; `request` the PATCH as text (what `--dry-run` prints).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from preflight.base.errors import UsageError
from preflight.outputs.schedulers.kube_decide import Node

TIMEOUT = 10.0
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PATCH_TYPE = "application/strategic-merge-patch+json"


class KubeError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def request(name: str, patch: dict[str, Any]) -> str:
    """The PATCH a change is sent as: the node's path, the content type, the body on one line."""
    return f"PATCH /api/v1/nodes/{urllib.parse.quote(name, safe='')} ({PATCH_TYPE})\n{json.dumps(patch)}"


class Api:
    """The API server over the standard library: a GET and a PATCH of one node, each with a deadline."""

    def __init__(self, base: str, sa_dir: Path | None = None, timeout: float = TIMEOUT):
        self.base, self.sa_dir, self.timeout = base.rstrip("/"), sa_dir or SA_DIR, timeout

    @classmethod
    def in_cluster(cls, env: Mapping[str, str] = os.environ) -> Api:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT") or "443"
        if not host:
            raise UsageError("KUBERNETES_SERVICE_HOST is not set: run kube-label in a pod (see examples/kubernetes/daemonset.yaml), where the kubelet sets it")
        return cls(f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}")

    def get_node(self, name: str) -> Node:
        return Node.from_json(self._call("GET", name))

    def list_nodes(self) -> list[Node]:
        return [Node.from_json(item) for item in self._call("GET", None).get("items") or []]

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self._call("PATCH", name, json.dumps(patch).encode())

    def _call(self, method: str, name: str | None, body: bytes | None = None) -> dict[str, Any]:
        """``name`` None: the node list."""
        url = f"{self.base}/api/v1/nodes" + (f"/{urllib.parse.quote(name, safe='')}" if name is not None else "")
        kind = {"Content-Type": PATCH_TYPE} if body is not None else {}
        req = urllib.request.Request(url, data=body, method=method, headers={"Accept": "application/json", **kind, **self._auth()})
        try:
            with self._opener(req.type == "https").open(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise _http_error(e, method, name) from None
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", e)
            if isinstance(why, TimeoutError):
                raise KubeError(f"the API server at {self.base} did not answer {method} within {self.timeout:g} s") from None
            if isinstance(why, ssl.SSLError):
                raise KubeError(f"TLS with the API server at {self.base} failed ({why}): is {self.sa_dir / 'ca.crt'} this cluster's CA?") from None
            raise KubeError(f"cannot reach the API server at {self.base}: {getattr(why, 'strerror', None) or why}") from None
        except ValueError:
            raise KubeError(f"the API server at {self.base} answered {method} node {name} with something that is not JSON") from None

    def _auth(self) -> dict[str, str]:
        if not self.base.startswith("https://"):
            return {}  # kubectl proxy or a test server: never a token in clear text
        try:  # read every time: the kubelet rotates it
            return {"Authorization": f"Bearer {(self.sa_dir / 'token').read_text().strip()}"}
        except OSError as e:
            raise KubeError(f"no service account token at {self.sa_dir / 'token'} ({e.strerror or e}): keep automountServiceAccountToken on for this pod") from None

    def _opener(self, tls: bool) -> urllib.request.OpenerDirector:
        # Straight to the API server: a proxy from the pod's environment has no business in between.
        if not tls:
            return urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            ctx = ssl.create_default_context(cafile=str(self.sa_dir / "ca.crt"))
        except OSError as e:
            raise KubeError(f"cannot load the cluster CA {self.sa_dir / 'ca.crt'} ({e.strerror or e}): keep automountServiceAccountToken on for this pod") from None
        return urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))


def _http_error(e: urllib.error.HTTPError, method: str, name: str | None) -> KubeError:
    try:
        said = ": " + str(json.loads(e.read())["message"])[:160]
    except (ValueError, OSError, TypeError, KeyError):
        said = ""
    fix = {
        401: "the API server refused the service account token: check the pod's serviceAccountName and token mount",
        403: f"not allowed to {method.lower()} {f'node {name}' if name else 'the node list'}: grant the ServiceAccount a ClusterRole with nodes: get, list, patch (examples/kubernetes/daemonset.yaml)",
        404: f"no node named {name!r}: --node / NODE_NAME must be the Kubernetes node name (fieldRef spec.nodeName)",
        409: f"node {name} kept changing while we patched it",
    }.get(e.code, f"the API server refused {method} node {name}")
    return KubeError(f"{fix} ({e.code} {e.reason}{said})", e.code)
