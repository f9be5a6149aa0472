"""The record of a run that started (preflight/outputs/record/run_record.py): what its reader
finds of the run it names, with real processes: this one, one that exited, a zombie,
a pid seen from another pid namespace; and records no run of ours wrote."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conftest import needs_root, run_record_file
from preflight.outputs.record import last_report, run_record


def now() -> datetime:
    return datetime.now(timezone.utc)


def test_a_run_under_way_is_read_back_alive(tmp_path):
    report = tmp_path / "report.json"
    started = now()
    run_record_file(report, started, alive=True, deadline_after=600)
    run = run_record.read(report)
    assert run == run_record.Started(started, started + timedelta(seconds=600), last_report.this_boot(), True)


def test_a_run_whose_process_is_gone_is_read_back_dead(tmp_path):
    report = tmp_path / "report.json"
    run_record_file(report, now(), alive=False)
    assert run_record.read(report).alive is False


def test_a_zombie_has_ended(tmp_path):
    # Killed, not yet reaped by its parent: the pid still answers, the run is over.
    report = tmp_path / "report.json"
    code = ("import sys; from datetime import datetime, timezone; from preflight.outputs.record import run_record; "
            "t = datetime.now(timezone.utc); open(sys.argv[1], 'w').write(run_record.render(t, t, None))")
    child = subprocess.Popen([sys.executable, "-c", code, str(run_record.path_for(report))])
    try:
        deadline = time.monotonic() + 60
        while Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.05)
        assert run_record.read(report).alive is False
    finally:
        child.wait()


def test_a_pid_taken_by_another_process_is_not_the_run(tmp_path):
    # The pid is this live process, but it started at another time: the run's pid was reused.
    report = tmp_path / "report.json"
    path = run_record_file(report, now(), alive=True)
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "process_start": record["process_start"] - 1}))
    assert run_record.read(report).alive is False


@needs_root
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare")
def test_from_another_pid_namespace_it_cannot_tell(tmp_path):
    # A pod reading the host's report: the pid means another process there, or none. The deadline decides.
    report = tmp_path / "report.json"
    run_record_file(report, now(), alive=True)
    code = f"from pathlib import Path; from preflight.outputs.record import run_record; print(run_record.read(Path({str(report)!r})).alive)"
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "None", p.stderr


def _per_mount_proc() -> bool:
    """Since Linux 5.8 each mount of /proc has its own hidepid: one in a private mount namespace leaves the host's alone."""
    release = os.uname().release.split(".")
    return (int(release[0]), int(re.match(r"\d+", release[1]).group())) >= (5, 8)


@needs_root
@pytest.mark.skipif(not shutil.which("runuser") or not _per_mount_proc(), reason="needs runuser and a kernel with per-mount /proc options")
def test_where_proc_hides_the_run_a_dead_one_is_still_told_from_a_live_one():
    # serve runs as its own user with ProtectProc=invisible: the gate's /proc/PID is hidden from it.
    shared = Path(tempfile.mkdtemp(prefix="preflight-hidepid-"))  # not under pytest's 0700 tmp: nobody must read it
    try:
        shared.chmod(0o755)
        report = shared / "report.json"
        report.write_text("{}")
        report.chmod(0o644)
        # run_record is standard library only, as `status` needs it: any python nobody may run reads it from the checkout.
        load = f"import sys; sys.path.insert(0, {str(Path(run_record.__file__).parents[3])!r}); from preflight.outputs.record import run_record"
        code = f"{load}; from pathlib import Path; print(run_record.read(Path({str(report)!r})).alive)"
        python = next((p for p in (sys.executable, "/usr/bin/python3") if subprocess.run(
            ["runuser", "-u", "nobody", "--", p, "-c", load], capture_output=True).returncode == 0), None)
        if python is None:
            pytest.skip("no python that user nobody may run, with this checkout readable to it")
        for alive, seen in ((True, "None"), (False, "False")):  # live but hidden: the deadline decides; gone: kill(pid, 0) says so
            run_record_file(report, now(), alive=alive).chmod(0o644)
            p = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t proc -o hidepid=invisible proc /proc && exec runuser -u nobody -- "
                                f"{shlex.quote(python)} -c {shlex.quote(code)}"], capture_output=True, text=True, timeout=60)
            assert p.returncode == 0 and p.stdout.strip() == seen, p.stderr
    finally:
        shutil.rmtree(shared)


def test_a_record_another_user_planted_in_a_shared_directory_is_ignored(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    report = shared / "report.json"
    report.write_text("{}")  # root's report
    path = run_record_file(report, now(), alive=False)
    assert run_record.read(report) is not None  # root's own record counts
    os.chown(path, 65534, 65534)  # as if user nobody had written it
    assert run_record.read(report) is None


def test_a_symlink_a_fifo_or_a_damaged_file_is_no_record(tmp_path):
    report = tmp_path / "report.json"
    path = run_record.path_for(report)
    real = run_record_file(tmp_path / "elsewhere.json", now(), alive=False)
    path.symlink_to(real)
    assert run_record.read(report) is None
    path.unlink()
    os.mkfifo(path)  # opened for reading, a FIFO with no writer would block: it must not
    assert run_record.read(report) is None
    path.unlink()
    for text in ("", "{", "[1]", '{"started_at": "yesterday"}', json.dumps({"started_at": "2026-01-01T00:00:00", "deadline": "2026-01-01T00:00:00",
                                                                                 "pid": 1, "process_start": 1, "boot_id": None})):
        path.write_text(text)
        assert run_record.read(report) is None, text


def test_no_record_is_none(tmp_path):
    assert run_record.read(tmp_path / "report.json") is None
