"""The last report and what it vouches for: the judge with recorded reports,
and `preflight status` / `status --npd` as NPD and a Slurm prolog run it."""

from __future__ import annotations

import json
import os
import re
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import REPORTS, needs_root, report_file, run_preflight, run_record_file
from preflight.outputs.record import last_report
from preflight.outputs.record.last_report import State, load, standing
from preflight.outputs.record.run_record import Started

BOOT = "9cf6e1ac-c217-4d2f-bda9-3b4a7183a613"  # the boot the fixtures were recorded in


def judged(fixture: str, boot: str | None = BOOT, after: float = 60.0, max_age: float | None = None):
    loaded = load(REPORTS / f"{fixture}.json")
    return standing(loaded, boot, loaded.report.finished_at + timedelta(seconds=after), max_age)


def test_a_pass_of_this_boot_vouches():
    st = judged("cpu-pass")
    assert st.vouched is True and st.current_boot is True and st.age_seconds == 60.0
    assert st.reason == "passed 60 s ago, profile cpu"


def test_a_pass_before_the_last_reboot_does_not():
    st = judged("cpu-pass", boot="another-boot")
    assert st.vouched is False and st.current_boot is False
    assert "before the last reboot" in st.reason


def test_a_failed_report_names_the_first_failing_check_and_its_summary():
    st = judged("shm-64m-fail", after=7200)
    assert st.vouched is False
    assert st.reason == "shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor (2.0 h ago)"


def test_the_reason_is_one_printable_line_whatever_a_summary_quotes(tmp_path):
    # A group run's nccl summary names a peer by what it posted at the meeting, which any host that
    # reaches the store can write (gpuwork/meeting.py); status, NPD, slurm-healthcheck and kube-label
    # print the reason to root's terminal or a log, so no escape sequence or newline may pass.
    hostile = "node 1 (gpu-7\x1b]0;owned\x07\x1b[2J\x9b1;1H\nvouched: passed) kept out of the group"
    report = report_file(tmp_path / "report.json", "shm-64m-fail")
    data = json.loads(report.read_text())
    data["checks"][0]["summary"] = hostile
    report.write_text(json.dumps(data))
    for loaded in (last_report.load(report), last_report.load_view(report)):
        st = standing(loaded, last_report.this_boot(), last_report.now())
        assert st.vouched is False
        assert not re.search(r"[\x00-\x1f\x7f-\x9f]", st.reason), st.reason
        assert "gpu-7\\x1b]0;owned\\x07\\x1b[2J\\x9b1;1H vouched" in st.reason
    # Nor a line separator or a bidirectional override, which break or reorder what a reader sees.
    assert last_report.printable("gpu-7\u2028vouched\u202edelliaf") == "gpu-7\\u2028vouched\\u202edelliaf"
    assert last_report.printable("GPU 0 (NVIDIA H100 80GB HBM3) é") == "GPU 0 (NVIDIA H100 80GB HBM3) é"
    code, out = status("--report", str(report))
    assert code == 1 and "\x1b" not in out and out.count("\n") == 1


def test_max_age_retires_an_old_pass():
    assert judged("cpu-pass", after=100, max_age=3600).vouched is True
    st = judged("cpu-pass", after=7200, max_age=3600)
    assert st.vouched is False and st.reason == "last pass is older than the 3600 s allowed (2.0 h ago); run preflight again"


def test_a_report_from_the_future_is_a_clock_problem():
    st = judged("cpu-pass", after=-3600)
    assert st.vouched is False and "future" in st.reason


def test_without_boot_ids_the_boot_time_decides():
    # /proc/sys/kernel/random/boot_id unreadable (an odd container): the report is of this boot if it finished after the boot.
    loaded = load(REPORTS / "cpu-pass.json")
    end = loaded.report.finished_at
    after_boot = standing(loaded, None, end + timedelta(seconds=60), booted=end - timedelta(hours=1))
    assert after_boot.vouched is True and after_boot.current_boot is True
    before_boot = standing(loaded, None, end + timedelta(hours=2), booted=end + timedelta(hours=1))
    assert before_boot.vouched is False and "before the last reboot" in before_boot.reason
    unknown = standing(loaded, None, end + timedelta(seconds=60))
    assert unknown.vouched is True and unknown.current_boot is None  # nothing to tell by: verdict and age alone


def test_booted_at_reads_this_machines_boot_time():
    booted = last_report.booted_at()
    assert booted is not None and booted < last_report.now()


def test_an_interrupted_run_says_so_naming_the_signal_and_when_it_started():
    loaded = load(REPORTS / "cpu-pass.json")
    r = loaded.report.model_copy(update={"verdict": "error", "interrupted_by_signal": 15, "exit_code": 143})
    st = standing(last_report.Loaded(State.OK, r), BOOT, r.finished_at)
    said = f"a run started at {last_report.utc(r.started_at)} was interrupted by SIGTERM (0 s ago)"
    # Nothing failed, after a pass of this boot: as a run that died, it says so (the prolog takes a fresh look).
    assert st.vouched is False and st.reason == said + f"; the last run that finished passed ({last_report.ago((r.finished_at - r.last_success_at).total_seconds())})"
    first = r.model_copy(update={"last_success_at": None})  # no pass before it: nothing to build on
    assert standing(last_report.Loaded(State.OK, first), BOOT, r.finished_at).reason == said


def test_a_failure_found_before_the_interruption_is_the_reason():
    # A node problem is what a drain reason must name, not that the run was then stopped.
    loaded = load(REPORTS / "shm-64m-fail.json")
    r = loaded.report.model_copy(update={"interrupted_by_signal": 15, "exit_code": 143})
    st = standing(last_report.Loaded(State.OK, r), BOOT, r.finished_at)
    assert st.vouched is False and st.reason.startswith("shm FAIL: /dev/shm is 64 MiB")


# A run that started after the report (outputs/record/run_record.py): under way, the last verdict
# stands; gone without writing its report, the node is not vouched.


def with_run(fixture: str, alive: bool | None, after: float = 30.0, boot: str | None = BOOT, deadline: float = 600.0):
    """The fixture's report with the record of a run that started ``after`` seconds after it finished."""
    loaded = load(REPORTS / f"{fixture}.json")
    start = loaded.report.finished_at + timedelta(seconds=after)
    return loaded._replace(started=Started(start, start + timedelta(seconds=deadline), boot, alive)), start


def test_a_run_under_way_leaves_the_last_verdict_standing():
    for fixture in ("cpu-pass", "shm-64m-fail"):
        loaded, start = with_run(fixture, alive=True)
        alone = standing(load(REPORTS / f"{fixture}.json"), BOOT, start + timedelta(seconds=60))
        st = standing(loaded, BOOT, start + timedelta(seconds=60))
        assert st == alone._replace(under_way=start)


def test_a_run_alive_past_its_deadline_is_stuck_and_vouches_for_nothing():
    # An fsync on a hung root disk, a stopped agent: it lives, and will never write its report.
    loaded, start = with_run("cpu-pass", alive=True, deadline=600.0)
    assert standing(loaded, BOOT, start + timedelta(seconds=599)).vouched is True
    st = standing(loaded, BOOT, start + timedelta(seconds=601))
    assert st.vouched is False and st.reason == f"a run started at {last_report.utc(start)} is still running past its deadline (601 s ago)"


def test_a_run_that_died_leaves_the_node_not_vouched_naming_when_it_started():
    loaded, start = with_run("cpu-pass", alive=False)
    st = standing(loaded, BOOT, start + timedelta(seconds=1639))
    assert st.vouched is False and st.reason == f"a run started at {last_report.utc(start)} did not finish (1639 s ago); the last run that finished passed (1669 s ago)"
    assert st.current_boot is True and st.age_seconds == 1639 + 30  # the report's, as serve exports it


def test_a_dead_run_after_a_pass_too_old_to_stand_gives_no_fresh_look():
    # PREFLIGHT_MAX_AGE in the prolog: a pass past it refuses on its own, and a run that died
    # after it must not open the way to a fresh quick look that would vouch again.
    loaded, start = with_run("cpu-pass", alive=False)
    assert "the last run that finished passed" in standing(loaded, BOOT, start + timedelta(seconds=60), max_age=3600).reason
    st = standing(loaded, BOOT, start + timedelta(seconds=60), max_age=60)
    assert st.vouched is False and "did not finish" in st.reason and "the last run that finished passed" not in st.reason


def test_a_run_its_report_speaks_for_is_settled():
    # Its record was left behind (removing it failed): the report started no earlier than the run.
    loaded, start = with_run("cpu-pass", alive=False, after=0.0)
    loaded = loaded._replace(started=loaded.started._replace(started_at=loaded.report.started_at))
    assert standing(loaded, BOOT, start + timedelta(seconds=60)).vouched is True


def test_a_run_of_an_earlier_boot_is_left_to_the_boot_rule():
    loaded, start = with_run("cpu-pass", alive=False)
    st = standing(loaded, "this-boot", start + timedelta(seconds=60))
    assert st.vouched is False and "before the last reboot" in st.reason
    # Without boot ids, the boot time tells: the run started before this boot.
    loaded = loaded._replace(started=loaded.started._replace(boot_id=None))
    st = standing(loaded, None, start + timedelta(hours=2), booted=start + timedelta(hours=1))
    assert st.vouched is False and "before the last reboot" in st.reason


def test_where_the_run_cannot_be_looked_at_its_deadline_decides():
    loaded, start = with_run("cpu-pass", alive=None, deadline=600)
    assert standing(loaded, BOOT, start + timedelta(seconds=599)).vouched is True
    st = standing(loaded, BOOT, start + timedelta(seconds=601))
    assert st.vouched is False and "did not finish" in st.reason


def test_a_dead_run_with_no_report_is_not_vouched_rather_than_unknown(tmp_path):
    loaded = load(tmp_path / "none.json")
    start = last_report.now()
    loaded = loaded._replace(started=Started(start, start, BOOT, False))
    assert standing(loaded, BOOT, start).vouched is False
    assert standing(loaded._replace(started=Started(start, start + timedelta(seconds=600), BOOT, True)), BOOT, start).vouched is None


def test_serve_exports_a_dead_run_as_not_vouched():
    from preflight.outputs.exporters.metrics import ReportCollector, render

    loaded, start = with_run("cpu-pass", alive=False)
    text = render(ReportCollector(lambda: loaded, live=lambda: (BOOT, start + timedelta(seconds=60), None))).decode()
    assert "preflight_vouched 0.0" in text and "preflight_run_passed 1.0" in text  # the report passed; it vouches for nothing now


@pytest.mark.parametrize(
    ("content", "state", "words"),
    [
        (None, State.MISSING, "no report at"),
        (b"{\"verdict\": \"pa", State.INVALID, "not a preflight report"),
        (b"[1, 2]", State.INVALID, "not a preflight report"),
        (b"{\"tool\": \"something-else\"}", State.INVALID, "not a preflight report"),
    ],
    ids=["missing", "truncated", "not-an-object", "not-ours"],
)
def test_an_unusable_report_is_unknown_never_a_pass(tmp_path, content, state, words):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_bytes(content)
    loaded = load(path)
    assert loaded.state == state and loaded.report is None and words in loaded.error
    assert standing(loaded, BOOT, last_report.now()).vouched is None


def test_a_report_of_a_newer_schema_is_refused_never_half_read(tmp_path):
    # A newer preflight may mean a field differently: a pass it wrote vouches for nothing here.
    for version in (2, "2", 2.0):
        path = report_file(tmp_path / "report.json", "cpu-pass", schema_version=version)
        for loaded in (load(path), last_report.load_view(path)):
            assert loaded.state == State.INVALID and loaded.report is None
            assert "schema 2" in loaded.error and "from a newer preflight" in loaded.error and "reads schema 1" in loaded.error
            assert standing(loaded, BOOT, last_report.now()).vouched is None


def test_a_directory_in_place_of_the_report_is_unreadable(tmp_path):
    loaded = load(tmp_path)
    assert loaded.state == State.UNREADABLE and "cannot read" in loaded.error


def test_a_fifo_in_place_of_the_report_is_unreadable_at_once(tmp_path):
    # Opened for reading, a FIFO with no writer blocks forever: NPD's status and every scrape would hang.
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    for read in (load, last_report.load_view):
        loaded = read(fifo)
        assert loaded.state == State.UNREADABLE and "not a regular file" in loaded.error


def test_a_nul_in_the_report_path_is_unreadable_not_a_crash():
    loaded = last_report.load_view(Path("/tmp/a\x00b.json"))
    assert loaded.state == State.UNREADABLE and "null byte" in loaded.error


@needs_root
def test_a_report_another_user_could_have_written_vouches_for_nothing(tmp_path):
    # nobody's PASS, stamped with this boot's id (anyone can read it), in a shared sticky
    # directory before root's first run: it must neither vouch for the node nor drain it.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = report_file(shared / "report.json", "cpu-pass", age=30)
    assert load(planted).state == State.OK  # root's own file there is read
    os.chown(planted, 65534, 65534)
    for read in (load, last_report.load_view):
        loaded = read(planted)
        assert loaded.state == State.UNREADABLE and loaded.error.startswith(f"not trusted: the report {planted} could have been written by another user (it is nobody's)")
        assert standing(loaded, last_report.this_boot(), last_report.now()).vouched is None
    code, out = status("--report", str(planted))
    assert code != 0 and not out.startswith("vouched")
    os.chown(planted, 0, 0)
    planted.chmod(0o666)  # root's, but anyone may rewrite it
    assert load(planted).error.startswith(f"not trusted: the report {planted} could have been written by another user (other users can write it)")
    # A link to root's report, made by another user: not followed.
    link = shared / "link.json"
    link.symlink_to(report_file(tmp_path / "root.json", "cpu-pass"))
    os.chown(link, 65534, 65534, follow_symlinks=False)
    assert load(link).error.startswith(f"not trusted: the report {link} is a symlink another user could have made")


def test_the_cache_sees_a_replaced_report(tmp_path):
    path = tmp_path / "report.json"
    cached = last_report.Cached(path)
    assert cached().state == State.MISSING
    report_file(path, "shm-64m-fail")
    assert cached().report.verdict == "fail"
    first = cached()
    assert cached() is first  # unchanged file: not parsed again
    tmp = tmp_path / "new.json"
    report_file(tmp, "cpu-pass")
    tmp.replace(path)  # as preflight writes it: rename over the old one
    assert cached().report.verdict == "pass"


# `preflight status`, as a Slurm prolog or a person runs it, and `--npd` as node-problem-detector runs it.


def status(*args: str) -> tuple[int, str]:
    p = run_preflight(["status", *args], timeout=60)
    assert p.stderr == "" or "error" in p.stderr
    return p.returncode, p.stdout


def test_status_vouches_for_a_pass_of_this_boot(tmp_path):
    path = report_file(tmp_path / "r.json", "cpu-pass", age=30)
    code, out = status("--report", str(path))
    assert code == 0 and out.startswith("vouched: passed") and "profile cpu" in out


def test_status_json_for_scripts(tmp_path):
    path = report_file(tmp_path / "r.json", "shm-64m-fail")
    code, out = status("--report", str(path), "--json")
    data = json.loads(out)
    assert code == 1 and data["vouched"] is False and data["verdict"] == "fail" and data["current_boot"] is True
    # A report from before actions: its FAIL asks for its status's action.
    assert (data["action"], data["domain"], data["action_check"]) == ("drain", "node", "shm")


def test_status_leads_with_the_action_while_the_report_speaks_for_this_boot(tmp_path):
    path = report_file(tmp_path / "r.json", "shm-64m-fail")
    data = json.loads(path.read_text())
    data["checks"][0].update(action="fix-job", domain="job", action_source="in a container (Docker (/.dockerenv))")
    path.write_text(json.dumps(data))
    code, out = status("--report", str(path))
    assert code == 1 and out.startswith("NOT vouched: [job] fix-job: shm FAIL: /dev/shm is 64 MiB")
    code, out = status("--npd", "--report", str(path))
    assert out.startswith("[job] fix-job: shm FAIL")
    stale = report_file(tmp_path / "old.json", "shm-64m-fail", boot="an-earlier-boot")
    code, out = status("--report", str(stale), "--json")
    assert json.loads(out)["action"] == "none"  # the boot since then may have cleared it
    assert status("--report", str(report_file(tmp_path / "p.json", "cpu-pass", age=30)))[1].startswith("vouched: passed")


@pytest.mark.parametrize(
    ("fixture", "boot", "age", "code", "words"),
    [
        ("cpu-pass", "this", 10, 0, "passed"),
        ("shm-64m-fail", "this", 10, 1, "shm FAIL: /dev/shm is 64 MiB"),
        ("cpu-pass", "an-earlier-boot", 10, 1, "before the last reboot"),
        ("h100-fake-hw-slowdown", "this", 10, 1, "cuda FAIL: GPU 6"),
    ],
    ids=["pass", "shm-fail", "stale-boot", "gpu-fail"],
)
def test_npd_exit_codes_and_message(tmp_path, fixture, boot, age, code, words):
    path = report_file(tmp_path / "r.json", fixture, boot=boot, age=age)
    got, out = status("--npd", "--report", str(path))
    assert got == code and words in out
    assert len(out.encode()) <= 80 and out.count("\n") == 1  # NPD keeps max_output_length bytes


def test_npd_says_unknown_without_a_usable_report(tmp_path):
    code, out = status("--npd", "--report", str(tmp_path / "none.json"))
    assert code == 2 and out.startswith("no report at") and len(out.encode()) <= 80
    (tmp_path / "bad.json").write_text("{")
    code, out = status("--npd", "--report", str(tmp_path / "bad.json"))
    assert code == 2 and "not a preflight report" in out


def test_npd_cuts_a_long_reason_at_80_bytes_on_a_character_boundary(tmp_path):
    path = report_file(tmp_path / "r.json", "shm-64m-fail")
    data = json.loads(path.read_text())
    data["checks"][0]["summary"] = "line one\n" + "é" * 100  # two bytes each: a byte cut could split one
    path.write_text(json.dumps(data))
    code, out = status("--npd", "--report", str(path))
    line = out.rstrip("\n")
    assert code == 1 and len(out.encode()) <= 80 and line.endswith("...") and "\n" not in line and line.startswith("[node] drain: shm FAIL: line one é")


def test_status_max_age_and_its_bad_input(tmp_path):
    path = report_file(tmp_path / "r.json", "cpu-pass", age=7200)
    assert status("--report", str(path), "--max-age", "3600")[0] == 1
    assert status("--report", str(path), "--max-age", "86400")[0] == 0
    p = run_preflight(["status", "--report", str(path), "--max-age", "0"])
    assert p.returncode == 2 and "--max-age 0: give a number of seconds above 0" in p.stderr and p.stdout == ""


def test_status_reads_the_report_path_from_the_environment(tmp_path):
    import os

    path = report_file(tmp_path / "r.json", "cpu-pass")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}, "PREFLIGHT_REPORT": str(path)}
    p = run_preflight(["status"], env=env)
    assert p.returncode == 0 and "vouched" in p.stdout


def test_status_never_writes_or_runs_anything(tmp_path):
    path = report_file(tmp_path / "r.json", "shm-64m-fail")
    before = path.read_bytes()
    status("--report", str(path))
    assert path.read_bytes() == before and sorted(p.name for p in Path(tmp_path).iterdir()) == ["r.json"]


def test_status_says_a_run_under_way_and_a_run_that_died(tmp_path):
    path = report_file(tmp_path / "r.json", "cpu-pass", age=600)
    started = last_report.now() - timedelta(seconds=60)
    run_record_file(path, started, alive=True)  # this test's own process: under way
    at = re.escape(last_report.utc(started))
    code, out = status("--report", str(path))
    assert code == 0 and re.fullmatch(rf"vouched: passed \d+ s ago, profile cpu; a run started at {at} is under way\n", out), out
    code, out = status("--report", str(path), "--json")
    assert code == 0 and json.loads(out)["run_under_way_since"] == started.isoformat()
    run_record_file(path, started, alive=False)  # a process that is gone
    code, out = status("--report", str(path))
    assert code == 1 and re.fullmatch(rf"NOT vouched: a run started at {at} did not finish \(\d+ s ago\); the last run that finished passed \(\d+ s ago\)\n", out), out
    code, out = status("--npd", "--report", str(path))
    assert code == 1 and out.startswith(f"a run started at {last_report.utc(started)} did not finish (") and len(out.encode()) <= 81, out
