"""`preflight kube-label`: the last report as a Kubernetes node label, and opt-in a taint.

A DaemonSet runs it on each GPU node. It never runs a check, and touches only
its own label and its own taint key. spec.taints is an atomic list (a strategic
merge patch replaces it whole), so a taint change sends the whole list just
read with the node's resourceVersion: the API server refuses it (409) if anyone
changed the node in between, and another controller's taint is never lost.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.base.errors import Interrupted, UsageError
from preflight.base.signals import interrupting
from preflight.outputs.last_report import Standing

LABEL = "preflight/result"
TAINT_KEY = "preflight/failed"
TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
TIMEOUT = 10.0
ATTEMPTS = 3  # a 409 means the node changed between our GET and PATCH: read it again
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PATCH_TYPE = "application/strategic-merge-patch+json"


class KubeError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Node:
    resource_version: str | None
    labels: dict[str, str]
    taints: list[dict[str, Any]]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Node:
        meta, spec = data.get("metadata") or {}, data.get("spec") or {}
        return cls(meta.get("resourceVersion"), dict(meta.get("labels") or {}), list(spec.get("taints") or []))


@dataclass(frozen=True)
class Change:
    label: str  # what the label should say: "pass" or "fail"
    patch: dict[str, Any] | None  # None: the node already says it
    what: tuple[str, ...] = ()  # the changes, in words


def decide(st: Standing, node: Node, taint: bool) -> Change:
    """What to change so the node says what the report says; nothing when it already does.
    A vouched node loses our taint even without --taint: it must not say "failed"."""
    want = "pass" if st.vouched else "fail"
    patch: dict[str, Any] = {}
    what: list[str] = []
    if node.labels.get(LABEL) != want:
        patch["metadata"] = {"labels": {LABEL: want}}
        what.append(f"label {LABEL}={want}")
    ours = [{k: t.get(k) for k in TAINT} for t in node.taints if t.get("key") == TAINT_KEY]
    others = [t for t in node.taints if t.get("key") != TAINT_KEY]
    taints = None
    if st.vouched and ours:
        taints, said = others, f"remove taint {TAINT_KEY}"
    elif not st.vouched and taint and ours != [TAINT]:
        taints, said = [*others, TAINT], f"taint {TAINT_KEY}=true:NoSchedule"
    if taints is not None:
        patch.setdefault("metadata", {})["resourceVersion"] = node.resource_version
        patch["spec"] = {"taints": taints}
        what.append(said)
    return Change(want, patch or None, tuple(what))


# A dry run that cannot read the node still shows the PATCH it would send; these stand for
# what only the node can say (its resourceVersion, the taints of others it sends back).
UNREAD_VERSION = "<the node's, as read>"
UNREAD_TAINTS = {"...": "the node's other taints, as read, unchanged"}


def decide_unread(st: Standing, taint: bool) -> Change:
    """The most a round could change on a node it could not read: the node is taken to say nothing
    of ours yet, and on a pass to carry our taint (the one thing a pass may have to take away)."""
    return decide(st, Node(UNREAD_VERSION, {}, [UNREAD_TAINTS, *([TAINT] if st.vouched else [])]), taint)


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

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self._call("PATCH", name, json.dumps(patch).encode())

    def _call(self, method: str, name: str, body: bytes | None = None) -> dict[str, Any]:
        url = f"{self.base}/api/v1/nodes/{urllib.parse.quote(name, safe='')}"
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


def _http_error(e: urllib.error.HTTPError, method: str, name: str) -> KubeError:
    try:
        said = ": " + str(json.loads(e.read())["message"])[:160]
    except (ValueError, OSError, TypeError, KeyError):
        said = ""
    fix = {
        401: "the API server refused the service account token: check the pod's serviceAccountName and token mount",
        403: f"not allowed to {method.lower()} node {name}: grant the ServiceAccount a ClusterRole with nodes: get, patch (examples/kubernetes/daemonset.yaml)",
        404: f"no node named {name!r}: --node / NODE_NAME must be the Kubernetes node name (fieldRef spec.nodeName)",
        409: f"node {name} kept changing while we patched it",
    }.get(e.code, f"the API server refused {method} node {name}")
    return KubeError(f"{fix} ({e.code} {e.reason}{said})", e.code)


def apply(api: Api, st: Standing, name: str, taint: bool, dry_run: bool = False, attempts: int = ATTEMPTS) -> Change:
    """GET the node, decide, PATCH only what differs; read again if someone wrote in between."""
    change = decide(st, api.get_node(name), taint)
    if dry_run or change.patch is None:
        return change
    try:
        api.patch_node(name, change.patch)
    except KubeError as e:
        if e.status == 409 and attempts > 1:
            return apply(api, st, name, taint, dry_run, attempts - 1)
        raise
    return change


@dataclass(frozen=True)
class Round:
    vouched: bool
    line: str
    error: bool = False
    wrote: bool = False
    key: tuple[object, ...] = ()  # the outcome: a log line is repeated only when it changes


def run_round(api: Api | None, judge: Callable[[], Standing], name: str, taint: bool, dry_run: bool = False, no_api: str = "") -> Round:
    """Read the verdict, bring the node in line: an error is a line, never a crash. A dry run
    says the PATCH it would send, and where the node cannot be read (``api`` None: ``no_api``
    says why), the most it could send: a preview needs no cluster."""
    unread = ""
    try:
        st = judge()
        if api is None:
            raise KubeError(no_api)
        change = apply(api, st, name, taint, dry_run)
    except (KubeError, UsageError) as e:
        if not (dry_run and isinstance(e, KubeError)):
            return Round(False, f"{e}; node {name} left as it is", error=True, key=("error", str(e)))
        unread, change = str(e), decide_unread(st, taint)
    did = f"{LABEL}={change.label} already, nothing to change" if change.patch is None else ("would " if dry_run else "") + ", ".join(change.what)
    line = f"{name}: {'vouched' if st.vouched else 'NOT vouched'} ({st.reason}); {did}"
    if dry_run and change.patch is not None:
        line += (f" (node not read: {unread}; this is the most it would change)" if unread else "") + "\n" + request(name, change.patch)
    return Round(bool(st.vouched), line, wrote=change.patch is not None and not dry_run, key=(st.vouched, change.label, unread))


def keep_applying(one: Callable[[], Round], every: float, say: Callable[[Round], None]) -> None:
    """A round every ``every`` seconds until a signal ends it (the caller catches it). A round is
    said when it wrote or its outcome changed: a steady node leaves nothing in the log for weeks."""
    last: tuple[object, ...] | None = None
    while True:
        r = one()
        if r.wrote or r.key != last:
            say(r)
        last = r.key
        time.sleep(every)


def main(node: str | None, taint: bool, every: float | None, dry_run: bool, api_server: str | None,
         judge: Callable[[], Standing], console: Any, emit: Callable[[str], None]) -> int:
    """`preflight kube-label` once its flags are read (``judge``: the last report's standing now):
    one round, exit 0 vouched and 1 not, or with ``every`` a round every so often until SIGTERM, exit 0."""
    name = node or os.environ.get("NODE_NAME")
    if not name and dry_run:
        name = os.uname().nodename.strip().lower()  # what the kubelet names its node unless told otherwise
        console.note(f"no --node or NODE_NAME: the node name is taken from the hostname, {name}")
    if not name:
        raise UsageError("no node name: set NODE_NAME from the downward API (env valueFrom.fieldRef.fieldPath: spec.nodeName) or pass --node NAME")
    if every is not None and not 0 < every <= 86400:
        raise UsageError(f"--every {every:g}: give a number of seconds above 0, at most 86400 (a day), e.g. 60")
    if api_server is not None and not api_server.startswith(("http://", "https://")):
        raise UsageError(f"--api-server {api_server}: give a URL, e.g. http://127.0.0.1:8001 for `kubectl proxy`")
    no_api = ""
    if api_server:
        api: Api | None = Api(api_server)
    elif dry_run and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        api, no_api = None, "not in a pod, KUBERNETES_SERVICE_HOST is not set"  # a preview needs no cluster
    else:
        api = Api.in_cluster()
    st = judge()  # a bad --max-age or config: exit 2 before any round

    def say(r: Round) -> None:
        if r.error:
            console.error(r.line)
        else:
            emit(r.line + "\n")

    if every is None:
        r = run_round(api, lambda: st, name, taint, dry_run, no_api)
        say(r)
        return 0 if r.vouched else 1
    try:
        with interrupting():
            keep_applying(lambda: run_round(api, judge, name, taint, dry_run, no_api), every, say)
    except Interrupted:
        pass  # SIGTERM from the kubelet: a clean stop
    return 0
