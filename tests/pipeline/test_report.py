from pathlib import Path

import pytest

from preflight.pipeline import report
from preflight.pipeline.check import Result
from preflight.base.findings import Status
from preflight.pipeline.report import Verdict, verdict_of


def results(*statuses):
    return [Result(check=f"c{i}", status=s, summary="x") for i, s in enumerate(statuses)]


@pytest.mark.parametrize(
    "statuses, verdict, code",
    [
        ((Status.PASS, Status.WARN, Status.SKIP), Verdict.PASS, 0),
        ((Status.PASS, Status.FAIL, Status.SKIP), Verdict.FAIL, 1),
        ((Status.ERROR, Status.SKIP), Verdict.ERROR, 3),
        ((Status.ERROR, Status.FAIL), Verdict.FAIL, 1),  # a node problem outranks a tool problem
        ((), Verdict.PASS, 0),
    ],
)
def test_verdict_and_exit_code(statuses, verdict, code):
    assert verdict_of(results(*statuses)) is verdict
    assert report.EXIT_CODES[verdict] == code


def test_versions_come_from_the_checks_that_saw_them():
    from preflight.pipeline.check import Result
    from preflight.base.findings import Status
    from preflight.pipeline.report import versions_of

    inventory_only = Result(check="cuda", status=Status.FAIL, summary="x", details={"inventory": {"driver_version": "550.54.15", "cuda_driver_version": "12.4"}})
    ranks = Result(check="nccl", status=Status.PASS, summary="y", details={"ranks": [{"rank": 0, "report": {"torch_version": "2.13.0+cpu"}}]})
    assert versions_of([inventory_only, ranks]) == {"driver": "550.54.15", "cuda": "12.4", "torch": "2.13.0+cpu"}
    init = Result(check="cuda", status=Status.PASS, summary="z", details={"versions": {"driver": "560.35.03", "cuda_driver": "12.6", "torch": "2.5.1+cu124"}})
    assert versions_of([init, ranks]) == {"driver": "560.35.03", "cuda": "12.6", "torch": "2.5.1+cu124"}
    assert versions_of([]) == {}


def _recorded(name: str):
    from pathlib import Path

    from preflight.pipeline.report import Report

    return Report.model_validate_json((Path(__file__).parents[1] / "fixtures" / "reports" / f"{name}.json").read_bytes())


ORDER = ["shm", "nccl", "bandwidth", "train"]


def test_a_partial_run_keeps_the_checks_it_left_out_and_never_turns_their_fail_into_a_pass():
    from preflight.base.findings import Status
    from preflight.pipeline.report import carry_forward

    gate = _recorded("cpu-pass")
    gate.checks[2] = gate.checks[2].model_copy(update={"status": Status.FAIL, "summary": "host memcpy below floor on rank 1"})
    gate.verdict, gate.exit_code = "fail", 1
    recheck = _recorded("cpu-pass")
    recheck.checks = recheck.checks[:2]  # --skip bandwidth,train
    kept = carry_forward(recheck, gate, ORDER)
    assert [c.check for c in kept] == ["bandwidth", "train"]
    assert [c.check for c in recheck.checks] == ORDER
    assert recheck.checks[2].details["carried_from"] == gate.finished_at.isoformat()
    assert (recheck.verdict, recheck.exit_code) == ("fail", 1)  # the gate's bandwidth FAIL stands until bandwidth runs again


def test_carried_results_keep_when_they_were_measured_across_rechecks():
    from preflight.pipeline.report import carry_forward

    gate, first, second = _recorded("cpu-pass"), _recorded("cpu-pass"), _recorded("cpu-pass")
    first.checks, second.checks = first.checks[:2], second.checks[:2]
    carry_forward(first, gate, ORDER)
    first = first.model_copy(update={"finished_at": gate.finished_at.replace(year=2030)})
    carry_forward(second, first, ORDER)
    assert second.checks[3].details["carried_from"] == gate.finished_at.isoformat()


def test_nothing_is_carried_from_another_boot_or_profile_and_an_interrupted_run_keeps_its_exit_code():
    from preflight.pipeline.report import carry_forward

    for change in ({"boot_id": "an-earlier-boot"}, {"profile": "h100-sxm"}):
        before = _recorded("cpu-pass").model_copy(update=change)
        now = _recorded("cpu-pass")
        now.checks = now.checks[:1]
        assert carry_forward(now, before, ORDER) == [] and len(now.checks) == 1
    interrupted = _recorded("shm-64m-fail").model_copy(update={"boot_id": _recorded("cpu-pass").boot_id, "interrupted_by_signal": 15, "exit_code": 143, "verdict": "fail"})
    interrupted.checks = interrupted.checks[:1]
    carry_forward(interrupted, _recorded("cpu-pass"), ORDER)
    assert interrupted.exit_code == 143


def test_an_interrupted_run_vouches_for_nothing_and_exits_128_plus_the_signal():
    from preflight.pipeline.report import exit_code_of

    assert verdict_of(results(Status.PASS, Status.PASS), interrupted=15) is Verdict.ERROR
    assert verdict_of(results(Status.PASS, Status.FAIL), interrupted=15) is Verdict.FAIL  # a node problem found still leads
    assert exit_code_of(Verdict.ERROR, 15) == 143 and exit_code_of(Verdict.FAIL, 2) == 130 and exit_code_of(Verdict.FAIL) == 1


def _sigtermed(before):  # noqa: ANN001, ANN202
    """cpu-pass as a run SIGTERM stopped in bandwidth: nccl and shm done, bandwidth ERROR, train skipped."""
    from preflight.pipeline.runner import cut_short

    now = _recorded("cpu-pass").model_copy(update={"interrupted_by_signal": 15, "exit_code": 143, "verdict": "error",
                                                   "finished_at": before.finished_at.replace(year=2030)})
    now.checks[2] = Result(check="bandwidth", status=Status.ERROR, summary="interrupted by SIGTERM while running", details=cut_short(15))
    now.checks[3] = Result(check="train", status=Status.SKIP, summary="skipped: the run was interrupted by SIGTERM", details=cut_short(15))
    return now


def test_a_sigtermed_run_keeps_the_last_complete_results_of_what_it_did_not_finish():
    from preflight.pipeline.report import carry_forward

    before = _recorded("cpu-pass")
    now = _sigtermed(before)
    kept = carry_forward(now, before, ORDER)
    assert [c.check for c in kept] == ["bandwidth", "train"] and [c.check for c in now.checks] == ORDER
    for fresh, old in zip(now.checks[:2], before.checks[:2]):
        assert fresh == old and "carried_from" not in fresh.details  # what it finished is its own
    for c, old, status in zip(now.checks[2:], before.checks[2:], ("ERROR", "SKIP")):
        assert (c.status, c.measurements) == (old.status, old.measurements) and c.measurements  # the figures, not a SKIP
        assert c.details["carried_from"] == before.finished_at.isoformat() and c.details["carried_level"] == "standard"
        assert c.details["interrupted"] == {"signal": 15, "status": status, "summary": (
            "interrupted by SIGTERM while running" if status == "ERROR" else "skipped: the run was interrupted by SIGTERM")}
    assert (now.verdict, now.exit_code, now.interrupted_by_signal) == ("error", 143, 15)  # it did not finish: it vouches for nothing


def test_a_sigtermed_run_keeps_an_earlier_fail_and_nothing_it_cannot_stand_behind():
    from preflight.pipeline.report import carry_forward

    before = _recorded("cpu-pass")
    before.checks[2] = before.checks[2].model_copy(update={"status": Status.FAIL, "summary": "host memcpy below floor on rank 1"})
    now = _sigtermed(before)
    carry_forward(now, before, ORDER)
    assert (now.checks[2].status, now.verdict, now.exit_code) == ("FAIL", "fail", 143)
    # A result the earlier run itself did not finish is no figure to keep: this run's own stands.
    before, now = _sigtermed(_recorded("cpu-pass")), _sigtermed(_recorded("cpu-pass"))
    before.finished_at = before.finished_at.replace(year=2029)
    assert carry_forward(now, before, ORDER) == [] and [c.status for c in now.checks] == ["PASS", "PASS", "ERROR", "SKIP"]
    # Nor from another boot: the run's own ERROR and SKIP stand.
    now = _sigtermed(_recorded("cpu-pass"))
    assert carry_forward(now, _recorded("cpu-pass").model_copy(update={"boot_id": "an-earlier-boot"}), ORDER) == []
    assert [c.status for c in now.checks] == ["PASS", "PASS", "ERROR", "SKIP"] and now.verdict == "error"


def test_nothing_is_carried_to_or_from_a_run_across_nodes():
    # A group's bandwidth is the network's and the other nodes' too: it says nothing of this node alone.
    from preflight.pipeline.report import carry_forward

    group = _recorded("group-pass-node1")
    alone = _recorded("cpu-pass").model_copy(update={"boot_id": group.boot_id})
    alone.checks = alone.checks[:1]
    assert carry_forward(alone, group, ORDER) == [] and len(alone.checks) == 1
    again = group.model_copy(update={"checks": group.checks[:2]})
    assert carry_forward(again, _recorded("cpu-pass").model_copy(update={"boot_id": group.boot_id}), ORDER) == []


def test_a_group_record_with_a_node_outside_the_group_is_refused():
    import pytest
    from pydantic import ValidationError

    from preflight.pipeline.report import GroupRecord

    record = _recorded("group-keptout-node0").group.model_dump()
    assert GroupRecord.model_validate(record).nodes[1].why.startswith("its shm check did not pass")  # a peer's words ride along
    for bad in ({"missing": [2]}, {"node_rank": 2}, {"nnodes": 0}, {"nnodes": 4097}):
        with pytest.raises(ValidationError):
            GroupRecord.model_validate({**record, **bad})


def test_last_success_from_a_report_written_before_the_field_existed():
    from preflight.pipeline.report import last_success

    failed = _recorded("shm-64m-fail")
    old_pass = _recorded("cpu-pass").model_copy(update={"last_success_at": None})
    assert last_success(failed, old_pass) == old_pass.finished_at
    assert last_success(failed, None) is None
    assert last_success(failed, failed) is None


# ---- levels: a lighter run never overwrites what a deeper one measured ------------------------------


def _quick(report, checks):  # noqa: ANN001, ANN202
    """``report`` rewritten as a quick run that ran only ``checks`` (results as given)."""
    return report.model_copy(update={"level": "quick", "checks": checks, "versions": {}})


def test_a_quick_run_keeps_the_standard_results_with_their_time_and_level_across_quick_runs():
    from preflight.pipeline.report import carry_forward

    gate = _recorded("cpu-pass")  # written before levels: a standard run
    first = _quick(_recorded("cpu-pass"), _recorded("cpu-pass").checks[:1])
    kept = carry_forward(first, gate, ORDER)
    assert [c.check for c in kept] == ["nccl", "bandwidth", "train"] and [c.check for c in first.checks] == ORDER
    assert {(c.details["carried_from"], c.details["carried_level"]) for c in kept} == {(gate.finished_at.isoformat(), "standard")}
    assert first.versions == {"torch": "2.13.0+cpu"}  # what the kept results saw, for preflight_info
    second = _quick(_recorded("cpu-pass"), _recorded("cpu-pass").checks[:1])
    carry_forward(second, first.model_copy(update={"finished_at": gate.finished_at.replace(year=2030)}), ORDER)
    assert {(c.details["carried_from"], c.details["carried_level"]) for c in second.checks[1:]} == {(gate.finished_at.isoformat(), "standard")}
    assert "carried_from" not in second.checks[0].details  # shm was measured now


def _cuda(status, measurements, **details):  # noqa: ANN001, ANN202
    from preflight.pipeline.check import Result

    return Result(check="cuda", status=status, summary=f"cuda {status}", measurements=measurements, details=details)


def _m(name, value, floor=None, gpu="0"):  # noqa: ANN001, ANN202
    from preflight.base.findings import Measurement

    return Measurement(name=name, unit="seconds" if "duration" in name else "generation", value=value, floor=floor, labels={"gpu": gpu})


def test_a_quick_pass_never_clears_a_standard_fail_of_the_same_check():
    from preflight.base.findings import Status
    from preflight.pipeline.report import carry_forward

    gate = _recorded("cpu-pass").model_copy(update={"verdict": "fail", "exit_code": 1})
    gate.checks = [_cuda(Status.FAIL, [], parts={"cuda_init": "FAIL"}), *gate.checks]
    quick = _quick(_recorded("cpu-pass"), [_cuda(Status.PASS, [], parts={"cuda_init": "not run: the quick level starts no CUDA work"})])
    kept = carry_forward(quick, gate, ["cuda", *ORDER])
    cuda = quick.checks[0]
    assert cuda.status == Status.FAIL and cuda.details["carried_level"] == "standard" and cuda in kept
    assert cuda.details["lighter_look"] == {"level": "quick", "status": "PASS", "summary": "cuda PASS"}
    assert (quick.verdict, quick.exit_code) == ("fail", 1)
    # A run as deep as the one that failed may clear it.
    again = _recorded("cpu-pass").model_copy(update={"level": "standard", "checks": [_cuda(Status.PASS, [])]})
    carry_forward(again, gate, ["cuda", *ORDER])
    assert again.checks[0].status == Status.PASS and "carried_from" not in again.checks[0].details and again.verdict == "pass"


def test_a_quick_look_takes_the_standard_figures_it_did_not_measure_and_its_own_fail_stands():
    from preflight.base.findings import Status
    from preflight.pipeline.report import carry_forward

    gate = _recorded("cpu-pass")
    loaded_gen, init = _m("gpu_pcie_link", 5, floor=5), _m("gpu_cuda_init_duration", 1.5)
    gate.checks = [_cuda(Status.PASS, [loaded_gen, init, _m("gpu_temperature", 31)]), *gate.checks]
    idle_gen, temperature = _m("gpu_pcie_link", 1), _m("gpu_temperature", 40)
    quick = _quick(_recorded("cpu-pass"), [_cuda(Status.PASS, [idle_gen, temperature])])
    assert carry_forward(quick, gate, ["cuda", *ORDER])  # nccl, bandwidth, train
    cuda = quick.checks[0]
    # Its own reading of what it measured, the gate's of what it did not (or read only idle, unjudged).
    assert sorted((m.name, m.value) for m in cuda.measurements) == [("gpu_cuda_init_duration", 1.5), ("gpu_pcie_link", 5), ("gpu_temperature", 40)]
    assert cuda.details["carried_measurements"] == {"from": gate.finished_at.isoformat(), "level": "standard", "names": ["gpu_cuda_init_duration", "gpu_pcie_link"]}
    assert "carried_from" not in cuda.details and cuda.status == Status.PASS
    # A FAIL this look found stands (with the gate's figures beside it): the node is failing now.
    failing = _quick(_recorded("cpu-pass"), [_cuda(Status.FAIL, [temperature])])
    carry_forward(failing, gate, ["cuda", *ORDER])
    assert failing.checks[0].status == Status.FAIL and failing.verdict == "fail"


def test_a_standard_run_after_a_quick_one_keeps_nothing_it_measured_again():
    from preflight.pipeline.report import carry_forward

    quick = _quick(_recorded("cpu-pass"), _recorded("cpu-pass").checks[:1])
    carry_forward(quick, _recorded("cpu-pass"), ORDER)
    gate = _recorded("cpu-pass").model_copy(update={"level": "standard"})
    assert carry_forward(gate, quick, ORDER) == [] and not any("carried_from" in c.details for c in gate.checks)
