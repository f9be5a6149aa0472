import os
import stat
from pathlib import Path

import pytest
from conftest import needs_root

from preflight.pipeline import report
from preflight.pipeline.check import Result
from preflight.base.findings import Status
from preflight.base.errors import UsageError
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


def test_atomic_write_replaces_and_is_world_readable(tmp_path):
    path = tmp_path / "report.json"
    report.write_atomic(path, "one")
    report.write_atomic(path, "two")
    assert path.read_text() == "two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["report.json"]


def test_a_failed_write_leaves_the_previous_report_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    report.write_atomic(path, "previous")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        report.write_atomic(path, "new")
    assert path.read_text() == "previous"
    assert os.listdir(tmp_path) == ["report.json"]


def test_report_path_checks_happen_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match=r"directory .*nope does not exist; create it"):
        report.check_writable(tmp_path / "nope" / "r.json")
    with pytest.raises(UsageError, match=r"is a directory"):
        report.check_writable(tmp_path)
    report.check_writable(tmp_path / "r.json")
    assert os.listdir(tmp_path) == []  # the probe cleans up after itself


@needs_root
def test_a_read_only_directory_is_refused_even_for_root(tmp_path):
    import shlex
    import subprocess
    import sys

    ro = tmp_path / "ro"
    ro.mkdir()
    code = (
        "from pathlib import Path; from preflight.pipeline.report import check_writable; "
        f"check_writable(Path({str(ro / 'r.json')!r}))"
    )
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {shlex.quote(str(ro))} && exec {sys.executable} -c {shlex.quote(code)}"],
        capture_output=True, text=True, timeout=60,
    )
    assert "cannot write in" in p.stderr and "Read-only file system" in p.stderr


def test_a_device_or_pipe_is_never_replaced_by_a_report(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match=r"is not a regular file"):
        report.check_writable(fifo)
    with pytest.raises(UsageError, match=r"is not a regular file"):
        report.check_writable(Path("/dev/null"))
    assert Path("/dev/null").is_char_device()


def test_a_symlinked_report_path_writes_through_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    link = tmp_path / "report.json"
    link.symlink_to(tmp_path / "real" / "report.json")
    target = report.check_writable(link)
    assert target == tmp_path / "real" / "report.json"
    report.write_atomic(target, "new")
    assert link.is_symlink() and link.read_text() == "new"


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


def test_nothing_is_carried_from_another_boot_or_profile_or_into_an_interrupted_run():
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
