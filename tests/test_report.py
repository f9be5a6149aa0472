import os
import stat
from pathlib import Path

import pytest
from conftest import needs_root

from preflight import report
from preflight.check import Result, Status
from preflight.errors import UsageError
from preflight.report import Verdict, verdict_of


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
    import subprocess, sys, shlex

    ro = tmp_path / "ro"
    ro.mkdir()
    code = (
        "from pathlib import Path; from preflight.report import check_writable; "
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
