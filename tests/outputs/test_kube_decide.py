"""`preflight kube-label`'s pure decision (preflight/outputs/schedulers/kube_decide.py) on
recorded nodes: the labels, taint and annotation a standing asks of a node as read, and the
scheduler's view of it. The command against FakeKubeApi: tests/outputs/test_kube_decide.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from preflight.base.actions import Action, Domain, Next
from preflight.outputs.schedulers import kube_decide
from preflight.outputs.record.last_report import Standing


# What `preflight status` said of real reports (a pass, an shm failure, none at all).
PASSED = Standing(True, "passed 12 s ago, profile cpu", True, 12.0)
FAILED = Standing(False, "shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor (3 s ago)", True, 3.0)
NO_REPORT = Standing(None, "no report at /var/lib/preflight/report.json: preflight has not run here with --report /var/lib/preflight/report.json")

# A GPU node as `kubectl get node -o json` shows it, trimmed: labels and taints that are not ours.
GPU_NODE: dict[str, Any] = {
    "kind": "Node",
    "apiVersion": "v1",
    "metadata": {
        "name": "gpu-node-17",
        "resourceVersion": "81734",
        "labels": {
            "kubernetes.io/hostname": "gpu-node-17",
            "kubernetes.io/os": "linux",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        },
    },
    "spec": {
        "podCIDR": "10.244.17.0/24",
        "taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2025-01-08T10:12:03Z"},
        ],
    },
}
OTHER_TAINTS = copy.deepcopy(GPU_NODE["spec"]["taints"])
OUR_TAINT = {"key": "preflight/failed", "value": "true", "effect": "NoSchedule"}


def node_json(label: str | None = None, ours: dict[str, Any] | None = None, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    data = copy.deepcopy(GPU_NODE)
    if label is not None:
        data["metadata"]["labels"]["preflight/result"] = label
    if taints is not None:
        data["spec"]["taints"] = taints
    if ours is not None:
        data["spec"]["taints"].insert(1, ours)
    return data


def node(**kw: Any) -> kube_decide.Node:
    return kube_decide.Node.from_json(node_json(**kw))


# --- the decision ------------------------------------------------------------


def test_a_pass_labels_an_unlabelled_node_and_nothing_else() -> None:
    change = kube_decide.decide(PASSED, node(), taint=True)
    assert change.patch == {"metadata": {"labels": {"preflight/result": "pass"}}}
    assert change.what == ("label preflight/result=pass",)


def test_a_fail_with_taint_labels_and_taints_keeping_every_other_taint() -> None:
    change = kube_decide.decide(FAILED, node(label="pass"), taint=True)
    assert change.patch == {
        # resourceVersion: the API server refuses the whole-list write if the node changed since the GET
        "metadata": {"labels": {"preflight/result": "fail"}, "resourceVersion": "81734"},
        "spec": {"taints": [*OTHER_TAINTS, OUR_TAINT]},
    }


def test_a_fail_without_taint_only_labels() -> None:
    change = kube_decide.decide(FAILED, node(label="pass"), taint=False)
    assert change.patch == {"metadata": {"labels": {"preflight/result": "fail"}}}


JOBS = FAILED._replace(action=Next(Action.FIX_JOB, Domain.JOB, "in a container (Docker (/.dockerenv)): its /dev/shm is what the job was started with"),
                       check="shm")
RESET = FAILED._replace(action=Next(Action.RESET_GPU, Domain.NODE, "NVIDIA Xid catalog (2026-11-22): Xid 48 WORKFLOW_XID_48"), check="cuda")


def test_the_action_is_a_label_beside_the_result_and_leaves_with_the_pass() -> None:
    change = kube_decide.decide(RESET, node(label="pass"), taint=False)
    assert change.patch == {"metadata": {"labels": {"preflight/result": "fail", "preflight/action": "reset-gpu"}}}
    labelled = node_json(label="fail")
    labelled["metadata"]["labels"]["preflight/action"] = "reset-gpu"
    change = kube_decide.decide(PASSED, kube_decide.Node.from_json(labelled), taint=False)
    assert change.patch == {"metadata": {"labels": {"preflight/result": "pass", "preflight/action": None}}}  # null deletes it
    assert change.what == ("label preflight/result=pass", "remove label preflight/action")


def test_the_jobs_fault_is_labelled_but_never_tainted_and_lifts_our_taint() -> None:
    change = kube_decide.decide(JOBS, node(label="pass"), taint=True)
    assert change.patch == {"metadata": {"labels": {"preflight/result": "fail", "preflight/action": "fix-job"}}}
    change = kube_decide.decide(JOBS, node(label="fail", ours=OUR_TAINT), taint=True)
    assert change.patch is not None and change.patch["spec"]["taints"] == OTHER_TAINTS
    assert "remove taint preflight/failed (the fault is the job's: fix-job)" in change.what


LEMON = PASSED._replace(action=Next(Action.SERVICE, Domain.NODE, "a lemon: failed 3 times in 7 days: shm, bandwidth, bandwidth"), check="history")


def test_a_passing_lemon_says_pass_and_service_and_is_tainted_until_its_history_asks_nothing() -> None:
    change = kube_decide.decide(LEMON, node(label="pass"), taint=True)
    assert change.patch == {"metadata": {"labels": {"preflight/action": "service"}, "resourceVersion": "81734"},
                            "spec": {"taints": [*OTHER_TAINTS, OUR_TAINT]}}
    assert kube_decide.decide(LEMON, node(label="pass"), taint=False).patch == {"metadata": {"labels": {"preflight/action": "service"}}}
    labelled = node_json(label="pass", ours=OUR_TAINT)
    labelled["metadata"]["labels"]["preflight/action"] = "service"
    assert kube_decide.decide(LEMON, kube_decide.Node.from_json(labelled), taint=True).patch is None  # it already says so
    lifted = kube_decide.decide(PASSED, kube_decide.Node.from_json(labelled), taint=True)  # the failures aged out of the window
    assert lifted.patch is not None and lifted.patch["spec"]["taints"] == OTHER_TAINTS and "remove taint preflight/failed" in lifted.what
    # A drift's watch is no reason to take the node out.
    drifting = PASSED._replace(action=Next(Action.WATCH, Domain.NODE, "drifting"), check="history")
    assert "spec" not in (kube_decide.decide(drifting, node(label="pass"), taint=True).patch or {})
    # Only the history's lemon takes a pass out: a plugin's WARN that names a drain does not.
    plugin = PASSED._replace(action=Next(Action.DRAIN, Domain.NODE, "a plugin's warning"), check="site-nic")
    assert "spec" not in (kube_decide.decide(plugin, node(label="pass"), taint=True).patch or {})


def test_a_device_plugin_advertising_fewer_gpus_than_the_run_found_fails_the_node() -> None:
    short = node_json(label="pass")
    short["status"] = {"allocatable": {"cpu": "224", "nvidia.com/gpu": "7"}}
    st = kube_decide.scheduler_view(PASSED._replace(gpus=8), kube_decide.Node.from_json(short))
    assert st.vouched is False and st.reason == "device plugin advertises 7 of 8 GPUs (nvidia.com/gpu allocatable)"
    assert (st.action.action, st.action.domain, st.check) == (Action.DRAIN, Domain.SOFTWARE, "kube-label")
    # A reset the report asks for stays the higher action; the reason names both.
    st = kube_decide.scheduler_view(RESET._replace(gpus=8), kube_decide.Node.from_json(short))
    assert st.action is RESET.action and st.reason.startswith("device plugin advertises 7 of 8 GPUs") and "shm FAIL" in st.reason
    for advertised in ("8", "16", None):  # all of them, time-slicing's replicas, or another way of giving GPUs
        fine = node_json(label="pass")
        fine["status"] = {"allocatable": {"nvidia.com/gpu": advertised} if advertised else {}}
        assert kube_decide.scheduler_view(PASSED._replace(gpus=8), kube_decide.Node.from_json(fine)) == PASSED._replace(gpus=8)
    assert kube_decide.scheduler_view(PASSED, kube_decide.Node.from_json(short)) == PASSED  # a report without a shape (cpu) is not held to it


def test_mig_slices_in_place_of_whole_gpus_are_not_held_to_the_count() -> None:
    mig = node_json(label="pass")
    mig["status"] = {"allocatable": {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}}
    assert kube_decide.scheduler_view(PASSED._replace(gpus=8), kube_decide.Node.from_json(mig)) == PASSED._replace(gpus=8)


def test_no_usable_report_is_not_vouched() -> None:
    change = kube_decide.decide(NO_REPORT, node(), taint=True)
    assert change.label == "fail"
    assert change.patch is not None and change.patch["spec"]["taints"] == [*OTHER_TAINTS, OUR_TAINT]


def test_a_pass_removes_our_taint_and_leaves_the_others_in_order() -> None:
    change = kube_decide.decide(PASSED, node(label="fail", ours=OUR_TAINT), taint=True)
    assert change.patch == {
        "metadata": {"labels": {"preflight/result": "pass"}, "resourceVersion": "81734"},
        "spec": {"taints": OTHER_TAINTS},
    }
    assert change.what == ("label preflight/result=pass", "remove taint preflight/failed")


def test_a_pass_removes_our_taint_even_without_taint_mode() -> None:
    # Tainting was switched off while the node was failing: a vouched node must not stay "failed".
    change = kube_decide.decide(PASSED, node(label="pass", ours=OUR_TAINT), taint=False)
    assert change.patch == {"metadata": {"resourceVersion": "81734"}, "spec": {"taints": OTHER_TAINTS}}


def test_a_fail_without_taint_mode_leaves_an_existing_taint_of_ours() -> None:
    assert kube_decide.decide(FAILED, node(label="fail", ours=OUR_TAINT), taint=False).patch is None


def test_our_key_with_another_effect_is_set_back_to_ours() -> None:
    odd = {"key": "preflight/failed", "value": "yes", "effect": "NoExecute", "timeAdded": "2025-01-08T10:12:03Z"}
    change = kube_decide.decide(FAILED, node(label="fail", ours=odd), taint=True)
    assert change.patch is not None and change.patch["spec"]["taints"] == [*OTHER_TAINTS, OUR_TAINT]


@pytest.mark.parametrize(("st", "label", "ours", "taint"), [
    (PASSED, "pass", None, True),
    (PASSED, "pass", None, False),
    (FAILED, "fail", OUR_TAINT, True),
    (FAILED, "fail", None, False),
    (NO_REPORT, "fail", OUR_TAINT, True),
])
def test_a_node_that_already_says_it_gets_no_patch(st: Standing, label: str, ours: dict[str, Any] | None, taint: bool) -> None:
    assert kube_decide.decide(st, node(label=label, ours=ours), taint).patch is None


def test_a_node_without_taints_is_not_given_an_empty_list() -> None:
    change = kube_decide.decide(PASSED, node(taints=[]), taint=True)
    assert "spec" not in (change.patch or {})


def test_other_labels_are_never_in_the_patch() -> None:
    for st in (PASSED, FAILED, NO_REPORT):
        for taint in (True, False):
            patch = kube_decide.decide(st, node(label="stale", ours=OUR_TAINT), taint).patch or {}
            assert set(patch.get("metadata", {}).get("labels", {})) <= {"preflight/result"}
            kept = [t for t in patch.get("spec", {}).get("taints", OTHER_TAINTS) if t["key"] != "preflight/failed"]
            assert kept == OTHER_TAINTS


def test_unread_the_change_is_the_most_a_round_could_send() -> None:
    # A dry run with no node to read: labels merge, so the label is exact; the taint list is the node's own.
    unread = [{"...": "the node's other taints, as read, unchanged"}]
    failed = kube_decide.decide_unread(FAILED, taint=True)
    assert failed.what == ("label preflight/result=fail", "taint preflight/failed=true:NoSchedule")
    assert failed.patch == {"metadata": {"labels": {"preflight/result": "fail"}, "resourceVersion": "<the node's, as read>"},
                            "spec": {"taints": [*unread, OUR_TAINT]}}
    assert kube_decide.decide_unread(FAILED, taint=False).patch == {"metadata": {"labels": {"preflight/result": "fail"}}}
    for taint in (True, False):  # a pass takes our taint away with or without --taint
        passed = kube_decide.decide_unread(PASSED, taint)
        assert passed.what == ("label preflight/result=pass", "remove taint preflight/failed")
        assert passed.patch and passed.patch["spec"] == {"taints": unread}
