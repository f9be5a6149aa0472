"""The history store (outputs/record/history.py) on real SQLite files: what a run leaves, retention,
the paths root refuses, and a database that is corrupt, locked, full, read-only or killed mid-write."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import REPORTS, needs_root

from preflight.base.findings import Status
from preflight.outputs.record import history
from preflight.pipeline.report import Report


def cpu_pass(**changes: object) -> Report:
    r = Report.model_validate_json((REPORTS / "cpu-pass.json").read_text())
    return r.model_copy(update=changes)


def later(r: Report, hours: float) -> Report:
    return r.model_copy(update={"started_at": r.started_at + timedelta(hours=hours), "finished_at": r.finished_at + timedelta(hours=hours)})


def test_a_run_is_one_row_with_its_checks_and_every_figure_it_measured(tmp_path):
    db = tmp_path / "history.db"
    r = cpu_pass()
    assert history.append(db, r, keep_days=90, keep_runs=100) == 1
    assert (db.stat().st_mode & 0o777) == 0o600
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    h = history.read(db)
    (run,) = h.runs
    assert run.verdict == "pass" and run.profile == "cpu" and run.level == r.level and run.action == "none" and run.failed == []
    assert run.statuses == {"shm": "PASS", "nccl": "PASS", "bandwidth": "PASS", "train": "PASS"}
    assert run.finished_at == r.finished_at and run.started_at == r.started_at
    assert sum(len(s.points) for s in h.series) == sum(len(c.measurements) for c in r.checks) == 33
    memcpy = next(s for s in h.series if s.name == "memcpy_bandwidth" and s.labels == {"rank": "0"})
    assert memcpy.check == "bandwidth" and memcpy.unit == "bytes_per_second" and memcpy.floor == 2e9 and memcpy.points[0][0] == 1


def test_a_result_carried_from_an_earlier_run_is_that_run_s_and_not_counted_again(tmp_path):
    db = tmp_path / "history.db"
    r = cpu_pass()
    bw = next(c for c in r.checks if c.check == "bandwidth")
    bw.details["carried_from"] = "2026-11-22T05:00:00+00:00"
    bw.status = Status.FAIL  # the gate's FAIL a lighter run keeps: counted by the run that found it
    history.append(db, r, 90, 100)
    (run,) = history.read(db).runs
    assert run.failed == [] and run.statuses["bandwidth"] == "FAIL"
    assert not [s for s in history.read(db).series if s.check == "bandwidth"]


def test_a_run_across_nodes_is_in_the_timeline_without_figures(tmp_path):
    group = Report.model_validate_json((REPORTS / "group-pass-node0.json").read_text())
    history.append(tmp_path / "history.db", group, 90, 100)
    h = history.read(tmp_path / "history.db")
    assert len(h.runs) == 1 and h.runs[0].verdict == group.verdict.value and h.series == []


def test_runs_past_the_count_or_the_age_are_dropped_with_their_figures(tmp_path):
    db = tmp_path / "history.db"
    base = cpu_pass()
    for i in range(6):
        history.append(db, later(base, i), keep_days=90, keep_runs=4)
    h = history.read(db)
    assert [r.id for r in h.runs] == [3, 4, 5, 6] and all([p for p, _ in s.points] == [3, 4, 5, 6] for s in h.series)
    # A month on, the rest is older than 7 days. Aged from the history's own timeline (a clock
    # ahead at boot must not age everything out), the month is counted from the run after.
    history.append(db, later(base, 24 * 30), keep_days=7, keep_runs=4)
    assert [r.id for r in history.read(db).runs] == [4, 5, 6, 7]
    history.append(db, later(base, 24 * 30 + 1), keep_days=7, keep_runs=4)
    h = history.read(db)
    assert [r.id for r in h.runs] == [7, 8] and all(len(s.points) == 2 for s in h.series)
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM results").fetchone()[0] == 8
        assert con.execute("SELECT count(*) FROM readings").fetchone()[0] == 66


def test_since_last_check_and_figure_pick_what_is_read(tmp_path):
    db = tmp_path / "history.db"
    base = cpu_pass()
    for i in range(5):
        history.append(db, later(base, i), 90, 100)
    assert [r.id for r in history.read(db, last=2).runs] == [4, 5]
    assert [r.id for r in history.read(db, since=base.finished_at + timedelta(hours=2.5)).runs] == [4, 5]
    h = history.read(db, check="train", figure="gemm_throughput")
    assert {(s.check, s.name) for s in h.series} == {("train", "gemm_throughput")} and len(h.runs) == 5
    # Each figure's last readings, whichever runs they were in, and those runs.
    h = history.read(db, since=base.finished_at + timedelta(days=1), per_figure=3)
    assert [r.id for r in h.runs] == [3, 4, 5] and all([p for p, _ in s.points] == [3, 4, 5] for s in h.series)


def test_no_history_yet_is_none_and_creates_nothing(tmp_path):
    assert history.read(tmp_path / "history.db") is None and list(tmp_path.iterdir()) == []


def test_a_symlink_at_the_database_or_its_wal_is_refused_and_nothing_is_written_through_it(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "history.db").symlink_to(target)
    with pytest.raises(history.HistoryError, match="is a symlink"):
        history.append(tmp_path / "history.db", cpu_pass(), 90, 100)
    (tmp_path / "history.db").unlink()
    (tmp_path / "history.db-wal").symlink_to(target)
    with pytest.raises(history.HistoryError, match="history.db-wal is a symlink"):
        history.append(tmp_path / "history.db", cpu_pass(), 90, 100)
    assert target.read_text() == "keep" and not (tmp_path / "history.db").exists()


def test_a_directory_other_users_can_write_is_refused_even_sticky(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    with pytest.raises(history.HistoryError, match="shared can be written by other users, and SQLite opens history.db"):
        history.append(d / "history.db", cpu_pass(), 90, 100)
    assert list(d.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_database_or_wal_another_user_could_have_written_is_refused(tmp_path):
    db = tmp_path / "history.db"
    history.append(db, cpu_pass(), 90, 100)
    os.chown(db, 65534, 65534)
    with pytest.raises(history.HistoryError, match=r"history.db is .*'s: another user could have written it; move it aside"):
        history.read(db)
    os.chown(db, 0, 0)
    db.chmod(0o622)
    with pytest.raises(history.HistoryError, match="history.db is writable by other users"):
        history.append(db, cpu_pass(), 90, 100)


def test_a_corrupt_database_is_one_line_and_left_as_it_is(tmp_path):
    db = tmp_path / "history.db"
    db.write_bytes(b"not sqlite at all\n" * 300)
    db.chmod(0o600)
    for attempt in (lambda: history.append(db, cpu_pass(), 90, 100), lambda: history.read(db)):
        with pytest.raises(history.HistoryError) as e:
            attempt()
        assert "not a database" in str(e.value) and "move it aside" in str(e.value) and "\n" not in str(e.value)
    assert db.read_bytes() == b"not sqlite at all\n" * 300


def test_a_database_locked_past_the_deadline_is_said_and_a_reader_still_reads(tmp_path, monkeypatch):
    db = tmp_path / "history.db"
    history.append(db, cpu_pass(), 90, 100)
    monkeypatch.setattr(history, "WAIT_SECONDS", 0.3)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer mid-transaction
    holder.execute("DELETE FROM readings")
    try:
        with pytest.raises(history.HistoryError, match="locked by another process for over 0.3 s"):
            history.append(db, later(cpu_pass(), 1), 90, 100)
        h = history.read(db)  # WAL: the reader sees the last committed run, not the writer's half
        assert len(h.runs) == 1 and sum(len(s.points) for s in h.series) == 33
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# Appends runs in a loop, each in its own transaction, printing its count as it goes: killed mid-write.
WRITER = textwrap.dedent("""
    import sys
    from datetime import timedelta
    from pathlib import Path
    from preflight.outputs.record import history
    from preflight.pipeline.report import Report
    r = Report.model_validate_json(Path(sys.argv[2]).read_text())
    for i in range(100000):
        r = r.model_copy(update={"finished_at": r.finished_at + timedelta(seconds=1)})
        history.append(Path(sys.argv[1]), r, 90, 100000)
        print(i, flush=True)
""")


def test_a_writer_killed_by_sigkill_mid_write_leaves_a_readable_database_of_whole_runs(tmp_path):
    db = tmp_path / "history.db"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(REPORTS / "cpu-pass.json")],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout is not None
        for _ in range(20):  # twenty runs written: it is mid-way through the next
            assert child.stdout.readline(), "the writer died"
        time.sleep(0.05)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    h = history.read(db)
    assert len(h.runs) >= 20
    # Every run whole: all 33 figures, or the run is not there.
    assert all(len(s.points) == len(h.runs) for s in h.series) and len(h.series) == 33
    history.append(db, later(cpu_pass(), 1000), 90, 100000)  # and the next run writes on
    assert len(history.read(db).runs) == len(h.runs) + 1


PROBE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from preflight.outputs.record import history
    from preflight.pipeline.report import Report
    try:
        history.append(Path(sys.argv[1]), Report.model_validate_json(Path(sys.argv[2]).read_text()), 90, 100)
        print("written")
    except history.HistoryError as e:
        print("said:", e)
""")


def in_small_tmpfs(tmp_path: Path, then: str) -> str:
    """PROBE run in a private mount namespace on a 1 MiB tmpfs at tmp_path/d after ``then`` (shell)."""
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    script = (f"mount -t tmpfs -o size=1m,mode=0700 tmpfs {d} && {sys.executable} -c '{PROBE}' {d}/history.db {REPORTS / 'cpu-pass.json'} && "
              f"{then} && {sys.executable} -c '{PROBE}' {d}/history.db {REPORTS / 'cpu-pass.json'}")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@needs_root
def test_a_full_disk_is_one_line(tmp_path):
    out = in_small_tmpfs(tmp_path, f"(dd if=/dev/zero of={tmp_path}/d/filler bs=64k 2>/dev/null; true)").splitlines()
    assert out[0] == "written" and out[1].startswith("said: ") and "full" in out[1], out


@needs_root
def test_a_read_only_filesystem_is_one_line(tmp_path):
    out = in_small_tmpfs(tmp_path, f"mount -o remount,ro {tmp_path}/d").splitlines()
    assert out[0] == "written" and out[1].startswith("said: ") and "read" in out[1].lower(), out


def test_a_directory_above_that_another_user_can_rename_is_refused(tmp_path):
    # SQLite opens the database by name after the check: a directory on the way that another
    # user owns (or may write, unsticky) could be swapped for one of theirs in between.
    above = tmp_path / "shared"
    above.mkdir()
    os.chown(above, 65534, 65534)  # nobody's: they may rename what is in it
    report = above / "rep" / "report.json"
    report.parent.mkdir()
    with pytest.raises(history.HistoryError, match=r"shared is nobody's, and SQLite opens .*history.db by name: another user could swap"):
        history.append(report.parent / "history.db", cpu_pass(), 90, 100)
    assert not (report.parent / "history.db").exists()


def test_a_clock_ahead_at_boot_does_not_age_out_the_history(tmp_path):
    db = tmp_path / "history.db"
    r = cpu_pass()
    for hours in range(3):
        history.append(db, later(r, hours), keep_days=90, keep_runs=100)
    history.append(db, later(r, 24 * 365), keep_days=90, keep_runs=100)  # a year ahead, until NTP sets it
    assert len(history.read(db).runs) == 4


def test_a_run_is_stored_with_what_its_checks_asked_not_its_historys_lemon(tmp_path):
    # A lemon's service is a judgement over the stored runs; stored as the run's own it would
    # count a later run's job faults (stored service, not fix-job) toward the next lemon.
    from preflight.pipeline.report import Result

    r = cpu_pass()
    r.history = Result(check="history", status=Status.WARN, summary="a lemon", action="service", domain="node", action_source="a lemon")
    assert str(r.action) == "service"
    db = tmp_path / "history.db"
    history.append(db, r, keep_days=90, keep_runs=100)
    (run,) = history.read(db).runs
    assert (run.action, run.domain) == ("none", "node")
