"""`preflight kube-label`: the last report as Kubernetes node labels, and opt-in a taint.

A DaemonSet runs it on each GPU node. It never runs a check, and touches only
its own labels (preflight/result, and preflight/action while the report asks for
one: preflight/base/actions.py) and its own taint key. It holds the scheduler's
view to the report: a device plugin that advertises fewer GPUs
(status.allocatable["nvidia.com/gpu"]) than the run found black-holes pods while
the node says Ready, so that fails the node too. A taint is never added to a node
whose fault is the job's (fix-job), nor past the cap on how many nodes of the
cluster preflight may have tainted at once (``--taint-cap``): a bad floor or a bad
driver rollout must not take a whole cluster out. spec.taints is an atomic list (a strategic
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from preflight.base import safefile
from preflight.base.actions import Action, Domain, Next, highest, takes_out
from preflight.base.errors import Interrupted, UsageError
from preflight.base.signals import interrupting
from preflight.outputs.schedulers import kube_cap
from preflight.outputs.record.last_report import Standing

LABEL = "preflight/result"
ACTION_LABEL = "preflight/action"
HISTORY = "history"  # outputs/history.CHECK: the result a lemon is (without importing sqlite3 here)
GPU_RESOURCE = "nvidia.com/gpu"  # what the NVIDIA device plugin advertises
TAINT_CAP = 0.1  # the share of the cluster's nodes preflight may have tainted at once (at least one node)
TAINT_KEY = "preflight/failed"
TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
# The node's own record of a taint the cap held back ("would taint: ..."), where `kubectl describe
# node` shows it: kube-label's DaemonSet mounts the report read-only, so it cannot say it there.
HELD_ANNOTATION = "preflight/held-back"
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
    allocatable_gpus: int | None = None  # status.allocatable["nvidia.com/gpu"]; None where none is advertised
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Node:
        meta, spec = data.get("metadata") or {}, data.get("spec") or {}
        allocatable = (data.get("status") or {}).get("allocatable") or {}
        advertised = allocatable.get(GPU_RESOURCE)
        try:
            gpus = int(str(advertised)) if advertised is not None else None
        except ValueError:
            gpus = None  # a quantity with a suffix is no GPU count a device plugin writes
        if gpus == 0 and any(str(k).startswith("nvidia.com/mig-") for k in allocatable):
            gpus = None  # MIG's mixed strategy gives its slices instead: no whole-GPU count to hold it to
        return cls(meta.get("resourceVersion"), dict(meta.get("labels") or {}), list(spec.get("taints") or []), gpus,
                   dict(meta.get("annotations") or {}))

    def ours_tainted(self) -> bool:
        return any(t.get("key") == TAINT_KEY for t in self.taints)

    def gpu_node(self) -> bool:
        """One preflight runs on: the NVIDIA device plugin advertises GPUs there, or GPU feature
        discovery labels it (control-plane and CPU nodes are never preflight's to taint)."""
        return self.allocatable_gpus is not None or self.labels.get("nvidia.com/gpu.present") == "true"


def scheduler_view(st: Standing, node: Node) -> Standing:
    """The standing, failed too where the device plugin advertises fewer GPUs than the run
    found. More is no fault (time-slicing advertises replicas); none advertised is left alone:
    a cluster may give GPUs another way (another resource name, DRA)."""
    if st.gpus is None or node.allocatable_gpus is None or node.allocatable_gpus >= st.gpus:
        return st
    said = f"device plugin advertises {node.allocatable_gpus} of {st.gpus} GPUs ({GPU_RESOURCE} allocatable)"
    plugin = Next(Action.DRAIN, Domain.SOFTWARE, f"{said}: pods asking for the rest are scheduled here and never start")
    then = highest([st.action, plugin])
    assert then is not None
    reason = said if st.vouched else f"{said}; {st.reason}"
    return st._replace(vouched=False, reason=reason, action=then, check="kube-label" if then is plugin else st.check)


@dataclass(frozen=True)
class Change:
    label: str  # what the label should say: "pass" or "fail"
    patch: dict[str, Any] | None  # None: the node already says it
    what: tuple[str, ...] = ()  # the changes, in words (and a taint the cap held back)
    standing: Standing | None = None  # as judged against the node (scheduler_view), where it was read
    held: bool = False  # a taint this round would add was held back (the cap, or a node list it could not read)
    counted: kube_cap.Count | None = None  # the cap's count, where a taint was weighed


def decide(st: Standing, node: Node, taint: bool, capped: str | None = None) -> Change:
    """What to change so the node says what the report says; nothing when it already does.
    A vouched node loses our taint even without --taint: it must not say "failed" (unless its
    history calls it a lemon: then it is labelled pass, action service, and tainted as a failure
    is); so does one whose fault is the job's (fix-job: the node is fine). ``capped``: why no taint may be added
    now (the cap on tainted nodes), said instead."""
    want = "pass" if st.vouched else "fail"
    patch: dict[str, Any] = {}
    what: list[str] = []
    labels: dict[str, str | None] = {}
    if node.labels.get(LABEL) != want:
        labels[LABEL] = want
        what.append(f"label {LABEL}={want}")
    action = None if st.action.action == Action.NONE else st.action.action.value
    if node.labels.get(ACTION_LABEL) != action:
        labels[ACTION_LABEL] = action  # None deletes it (a strategic merge patch's null)
        what.append(f"label {ACTION_LABEL}={action}" if action else f"remove label {ACTION_LABEL}")
    if labels:
        patch["metadata"] = {"labels": labels}
    ours = [{k: t.get(k) for k in TAINT} for t in node.taints if t.get("key") == TAINT_KEY]
    others = [t for t in node.taints if t.get("key") != TAINT_KEY]
    jobs = st.action.action == Action.FIX_JOB
    # Out of service: not vouched, or vouched but a lemon (the history asks service:
    # history_judge), the one thing on a pass that takes a node out, as slurm.lemon_cause.
    out = not st.vouched or lemon(st)
    taints = None
    if (not out or jobs) and ours:
        taints, said = others, f"remove taint {TAINT_KEY}" + (" (the fault is the job's: fix-job)" if jobs and not st.vouched else "")
    elif out and not jobs and taint and ours != [TAINT]:
        if capped and not ours:
            what.append(capped)
        else:
            taints, said = [*others, TAINT], f"taint {TAINT_KEY}=true:NoSchedule"
    if taints is not None:
        patch.setdefault("metadata", {})["resourceVersion"] = node.resource_version
        patch["spec"] = {"taints": taints}
        what.append(said)
    held = capped if capped and not ours and out and not jobs and taint else None
    if node.annotations.get(HELD_ANNOTATION) != held:
        patch.setdefault("metadata", {})["annotations"] = {HELD_ANNOTATION: held}  # None deletes it
        if held is None:
            what.append(f"remove annotation {HELD_ANNOTATION}")
    return Change(want, patch or None, tuple(what))


# A dry run that cannot read the node still shows the PATCH it would send; these stand for
# what only the node can say (its resourceVersion, the taints of others it sends back).
UNREAD_VERSION = "<the node's, as read>"
UNREAD_TAINTS = {"...": "the node's other taints, as read, unchanged"}


def decide_unread(st: Standing, taint: bool) -> Change:
    """The most a round could change on a node it could not read: the node is taken to say nothing
    of ours yet, and on a pass to carry our taint (the one thing a pass may have to take away)."""
    return decide(st, Node(UNREAD_VERSION, {}, [UNREAD_TAINTS, *([TAINT] if st.vouched and not lemon(st) else [])]), taint)


def lemon(st: Standing) -> bool:
    """A pass its history calls a lemon: tainted as a failure is (within the cap)."""
    return bool(st.vouched) and st.check == HISTORY and takes_out(st.action)


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


def past_cap(api: Api, share: float) -> tuple[str | None, kube_cap.Count | None]:
    """Why no further node may be tainted now (or None), and the count it rests on: the nodes
    that carry our taint already against ``share`` of the cluster's GPU nodes (at least one). Where
    the list cannot be read the cap cannot be kept, so nothing is tainted either."""
    try:
        nodes = api.list_nodes()
    except KubeError as e:
        return f"not tainted: the nodes preflight has tainted could not be counted for the cap ({e})", None
    gpu_nodes = [n for n in nodes if n.gpu_node() or n.ours_tainted()]
    c = kube_cap.count(sum(1 for n in gpu_nodes if n.ours_tainted()), len(gpu_nodes), share)
    return (kube_cap.would_taint(c, share) if c.full else None), c


def apply(api: Api, st: Standing, name: str, taint: bool, dry_run: bool = False, attempts: int = ATTEMPTS, cap: float = TAINT_CAP) -> Change:
    """GET the node, decide, PATCH only what differs; read again if someone wrote in between.
    A taint this round would add is first held to the cap (the node list)."""
    node = api.get_node(name)
    report_said, st = st, scheduler_view(st, node)
    change = decide(st, node, taint)
    if change.patch and "spec" in change.patch and not node.ours_tainted():
        why, counted = past_cap(api, cap)
        change = replace(decide(st, node, taint, capped=why) if why else change, counted=counted, held=why is not None)
    change = replace(change, standing=st)
    if dry_run or change.patch is None:
        return change
    try:
        api.patch_node(name, change.patch)
    except KubeError as e:
        if e.status == 409 and attempts > 1:
            return apply(api, report_said, name, taint, dry_run, attempts - 1, cap)  # viewed against the fresh copy
        raise
    return change


@dataclass(frozen=True)
class Round:
    vouched: bool
    line: str
    error: bool = False
    wrote: bool = False
    key: tuple[object, ...] = ()  # the outcome: a log line is repeated only when it changes
    held: bool = False  # a taint held back this round (Change.held)
    counted: kube_cap.Count | None = None


def run_round(api: Api | None, judge: Callable[[], Standing], name: str, taint: bool, dry_run: bool = False, no_api: str = "",
              cap: float = TAINT_CAP) -> Round:
    """Read the verdict, bring the node in line: an error is a line, never a crash. A dry run
    says the PATCH it would send, and where the node cannot be read (``api`` None: ``no_api``
    says why), the most it could send: a preview needs no cluster."""
    unread = ""
    try:
        st = judge()
        if api is None:
            raise KubeError(no_api)
        change = apply(api, st, name, taint, dry_run, cap=cap)
        st = change.standing or st
    except (KubeError, UsageError) as e:
        if not (dry_run and isinstance(e, KubeError)):
            return Round(False, f"{e}; node {name} left as it is", error=True, key=("error", str(e)))
        unread, change = str(e), decide_unread(st, taint)
    if change.patch is None:
        did = "; ".join([f"{LABEL}={change.label} already, nothing to change", *change.what])
    else:
        did = ("would " if dry_run else "") + ", ".join(change.what)
    line = f"{name}: {'vouched' if st.vouched else 'NOT vouched'} ({st.reason}); {did}"
    if dry_run and change.patch is not None:
        line += (f" (node not read: {unread}; this is the most it would change)" if unread else "") + "\n" + request(name, change.patch)
    return Round(bool(st.vouched), line, wrote=change.patch is not None and not dry_run, key=(st.vouched, change.label, unread, change.held),
                 held=change.held, counted=change.counted)


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
         judge: Callable[[], Standing], console: Any, emit: Callable[[str], None], cap: float = TAINT_CAP,
         textfile_dir: Path | None = None) -> int:
    """`preflight kube-label` once its flags are read (``judge``: the last report's standing now):
    one round, exit 0 vouched and 1 not, or with ``every`` a round every so often until SIGTERM, exit 0."""
    name = node or os.environ.get("NODE_NAME")
    if not name and dry_run:
        name = os.uname().nodename.strip().lower()  # what the kubelet names its node unless told otherwise
        console.note(f"no --node or NODE_NAME: the node name is taken from the hostname, {name}")
    if not name:
        raise UsageError("no node name: set NODE_NAME from the downward API (env valueFrom.fieldRef.fieldPath: spec.nodeName) or pass --node NAME")
    if not 0 < cap <= 1:
        raise UsageError(f"--taint-cap {cap:g}: give the share of the cluster's nodes preflight may have tainted at once, above 0 and at most 1, e.g. 0.1")
    if every is not None and not 0 < every <= 86400:
        raise UsageError(f"--every {every:g}: give a number of seconds above 0, at most 86400 (a day), e.g. 60")
    if api_server is not None and not api_server.startswith(("http://", "https://")):
        raise UsageError(f"--api-server {api_server}: give a URL, e.g. http://127.0.0.1:8001 for `kubectl proxy`")
    if textfile_dir is not None:  # refused before the API server is asked anything
        if not textfile_dir.is_dir():
            raise UsageError(f"--textfile-dir {textfile_dir} is not a directory; point it at node_exporter's --collector.textfile.directory")
        safefile.check(textfile_dir / kube_cap.TEXTFILE, f"--textfile-dir {textfile_dir}", kube_cap.TEXTFILE)
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

    def one(judged: Callable[[], Standing]) -> Round:
        r = run_round(api, judged, name, taint, dry_run, no_api, cap)
        if textfile_dir is not None and not dry_run and not r.error:  # an error leaves the last round's word
            try:
                safefile.write_atomic(textfile_dir / kube_cap.TEXTFILE, kube_cap.textfile(name, r.held, r.counted))
            except OSError as e:
                console.error(f"could not write {textfile_dir / kube_cap.TEXTFILE}: {e.strerror or e}")
        return r

    if every is None:
        r = one(lambda: st)
        say(r)
        return 0 if r.vouched else 1
    try:
        with interrupting():
            keep_applying(lambda: one(judge), every, say)
    except Interrupted:
        pass  # SIGTERM from the kubelet: a clean stop
    return 0
