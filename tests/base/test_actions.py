"""The action ladder: what a fleet's automation switches on."""

import json

from preflight.base.actions import LADDER, Action, Domain, Next, default_for, drain_prefix, highest
from preflight.base.findings import Finding, Status
from preflight.pipeline.check import Check, Result
from preflight.pipeline.report import Report, Verdict


class Probe(Check):
    name = "probe"
    description = "a stand-in"

    def run(self, ctx):  # pragma: no cover - conclude is what is tested
        raise NotImplementedError


def test_the_ladder_escalates_from_nothing_to_the_vendor():
    assert [str(a) for a in LADDER] == ["none", "watch", "fix-job", "drain", "reset-gpu", "reboot", "service"]


def test_the_highest_action_decides_and_on_a_tie_the_nodes_domain():
    job = Next(Action.DRAIN, Domain.JOB, "a")
    node = Next(Action.DRAIN, Domain.NODE, "b")
    reset = Next(Action.RESET_GPU, Domain.SOFTWARE, "c")
    assert highest([job, node]) is node and highest([node, job]) is node
    assert highest([job, reset, node]) is reset
    assert highest([]) is None


def test_a_status_alone_asks_for_its_default():
    assert default_for(Status.FAIL).action is Action.DRAIN and default_for(Status.FAIL).domain is Domain.NODE
    assert default_for(Status.WARN).action is Action.WATCH
    assert default_for(Status.ERROR).domain is Domain.SOFTWARE  # preflight's own trouble is never the hardware's
    assert default_for(Status.PASS).action is default_for(Status.SKIP).action is Action.NONE


def test_the_drain_reason_starts_with_the_domain_then_the_action():
    assert drain_prefix(Next(Action.RESET_GPU, Domain.NODE, "x")) == "preflight [node] reset-gpu"


def test_a_result_takes_the_highest_of_its_findings_actions_with_its_source():
    job = Finding(Status.FAIL, "shm small", "64 MiB", "--shm-size", act=Next(Action.FIX_JOB, Domain.JOB, "a container's /dev/shm"))
    gone = Finding(Status.FAIL, "a GPU gone", "fell off", "RMA", act=Next(Action.SERVICE, Domain.NODE, "Xid 79"))
    r = Probe().conclude([job, gone], "fine")
    assert (r.status, r.action, r.domain, r.action_source) == (Status.FAIL, Action.SERVICE, Domain.NODE, "Xid 79")
    plain = Probe().conclude([Finding(Status.FAIL, "slow", "slow", "look")], "fine")
    assert (plain.action, plain.domain) == (Action.DRAIN, Domain.NODE)
    assert Probe().conclude([], "fine").action is Action.NONE


def test_a_result_from_before_actions_gets_its_statuss():
    r = Result.model_validate({"check": "shm", "status": "WARN", "summary": "x"})
    assert (r.action, r.domain) == (Action.WATCH, Domain.NODE)


def _report(*checks: Result) -> Report:
    return Report(version="0", hostname="h", boot_id=None, profile="cpu", started_at="2026-11-27T00:00:00Z", finished_at="2026-11-27T00:00:01Z",
                  duration_seconds=1.0, verdict=Verdict.FAIL, exit_code=1, checks=list(checks))


def test_the_reports_action_is_its_checks_highest_and_names_the_check():
    shm = Result(check="shm", status=Status.FAIL, summary="x", action=Action.FIX_JOB, domain=Domain.JOB, action_source="a container's /dev/shm")
    cuda = Result(check="cuda", status=Status.FAIL, summary="y", action=Action.RESET_GPU, domain=Domain.NODE, action_source="Xid 48")
    r = _report(shm, cuda)
    data = json.loads(r.model_dump_json())
    assert (data["action"], data["domain"], data["action_check"], data["action_source"]) == ("reset-gpu", "node", "cuda", "Xid 48")
    assert Report.model_validate(data).action is Action.RESET_GPU  # read back: derived again, not stored apart
    r.checks = [shm]  # a result carried or replaced: the action follows
    assert (r.action, r.action_check) == (Action.FIX_JOB, "shm")


def test_a_report_with_nothing_to_do_names_no_check():
    r = _report(Result(check="shm", status=Status.PASS, summary="ok"), Result(check="rdma", status=Status.SKIP, summary="no NIC"))
    assert (r.action, r.action_check) == (Action.NONE, None)


def test_a_warning_never_asks_more_than_fix_job_whatever_its_finding_names():
    # /dev/shm on ramfs on the host warns; the node's setup would be a drain, but the node is vouched.
    ramfs = Finding(Status.WARN, "/dev/shm is ramfs", "no size", "mount a tmpfs", act=Next(Action.DRAIN, Domain.SOFTWARE, "the host's /dev/shm"))
    assert (ramfs.next.action, ramfs.next.domain) == (Action.WATCH, Domain.SOFTWARE) and "the node keeps its jobs" in ramfs.next.source
    jobs = Finding(Status.WARN, "NCCL_SHM_DISABLE=1", "env", "unset it", act=Next(Action.FIX_JOB, Domain.JOB, "the job's environment"))
    assert jobs.next.action is Action.FIX_JOB
    r = Probe().conclude([ramfs], "fine")
    assert (r.status, r.action) == (Status.WARN, Action.WATCH)
