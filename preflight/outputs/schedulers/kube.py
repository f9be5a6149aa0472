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

What to change is decided in kube_decide.py (pure, from the report and the node as
read); the API server is spoken to in kube_api.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from preflight.base import safefile
from preflight.base.errors import Interrupted, UsageError
from preflight.base.signals import interrupting
from preflight.outputs.schedulers import kube_cap
from preflight.outputs.schedulers.kube_api import Api, KubeError, request
from preflight.outputs.schedulers.kube_decide import LABEL, Change, decide, decide_unread, scheduler_view
from preflight.outputs.record.last_report import Standing

TAINT_CAP = 0.1  # the share of the cluster's nodes preflight may have tainted at once (at least one node)
ATTEMPTS = 3  # a 409 means the node changed between our GET and PATCH: read it again


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
