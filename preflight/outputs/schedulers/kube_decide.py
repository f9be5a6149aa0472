"""What `preflight kube-label` would change on a node, decided from the report's standing
and the node as read, without a word to the API server: the node (`Node`, from the
API server's JSON), the scheduler's view of it (a device plugin advertising fewer GPUs
than the run found fails it), and `decide`, the labels, taint and annotation that
bring it in line (outputs/schedulers/kube.py sends them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from preflight.base.actions import Action, Domain, Next, highest, takes_out
from preflight.outputs.schedulers import kube_cap
from preflight.outputs.record.last_report import Standing

LABEL = "preflight/result"
ACTION_LABEL = "preflight/action"
HISTORY = "history"  # outputs/history.CHECK: the result a lemon is (without importing sqlite3 here)
GPU_RESOURCE = "nvidia.com/gpu"  # what the NVIDIA device plugin advertises
TAINT_KEY = "preflight/failed"
TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
# The node's own record of a taint the cap held back ("would taint: ..."), where `kubectl describe
# node` shows it: kube-label's DaemonSet mounts the report read-only, so it cannot say it there.
HELD_ANNOTATION = "preflight/held-back"


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
