"""`preflight run`'s verdict where machines read it (preflight/outputs/gate.py), as real
processes on the cpu profile (gloo torchrun): what every reader of the report says of a
run killed or stopped mid-way, the textfile, the report and the console agreeing when
the disk is too full for the report, and another run holding the lock, with and
without `--if-locked skip` (what the Slurm prolog runs; the holder takes the lock as
every run does, conftest.lock_held)."""

from __future__ import annotations

import io
import json
import os
import sys
import re
import secrets
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import fakes
import pytest
from conftest import clean_env, lock_held, needs_root, report_file, run_preflight
from preflight.gpuwork.processes import marked
from preflight.base.errors import UsageError
from preflight.outputs.record import last_report, run_record
from preflight.pipeline.report import Report

MARK = "PREFLIGHT_TEST_GATE"  # carried by everything a run here starts, so the test ends what a killed agent leaves


@contextmanager
def a_run(tmp_path: Path, report: Path, *extra: str) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """`preflight run --profile cpu --report REPORT`, yielded once its bandwidth check has
    begun. Rank 1 stops itself (SIGSTOP) at bandwidth's first step, so the check cannot
    end on its own while the test interrupts it, however loaded the machine. Whatever
    the run started is killed on the way out."""
    token = secrets.token_hex(8)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**clean_env(), "TMPDIR": str(tmp_path / "tmp"), "PREFLIGHT_WORKER_FAULT": "1:stop@memcpy", MARK: token}
    proc = subprocess.Popen([*fakes.PREFLIGHT, "run", "--profile", "cpu", "--report", str(report), *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    began = threading.Event()

    def follow() -> None:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("  ... bandwidth"):
                began.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        assert began.wait(300), "bandwidth never began:\n" + "".join(lines)
        yield proc, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        for p in marked(token, MARK):  # a killed agent's torchrun and ranks (ending them is the launcher's job, not this test's subject)
            p.kill()
        reader.join(timeout=10)


def started_at(report: Path) -> str:
    """When the run under way started, as every reader's line says it."""
    return last_report.utc(datetime.fromisoformat(json.loads(run_record.path_for(report).read_text())["started_at"]))


def readers(report: Path) -> dict[str, subprocess.CompletedProcess]:
    """Every reader of the report, as NPD, a Slurm prolog and health check, and a node agent run it."""
    at = ["--report", str(report)]
    return {
        "status": run_preflight(["status", *at]),
        "npd": run_preflight(["status", "--npd", *at]),
        "slurm": run_preflight(["slurm-healthcheck", "--dry-run", "--node", "gpu-01", *at]),
        "kube": run_preflight(["kube-label", "--dry-run", "--node", "gpu-01", *at]),
    }


def test_a_run_under_way_leaves_the_last_pass_standing_and_a_killed_one_leaves_the_node_not_vouched(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass", age=600)
    before = report.read_bytes()
    with a_run(tmp_path, report) as (agent, _):
        when = started_at(report)
        during = readers(report)
        agent.kill()  # SIGKILL of the agent: the OOM killer, systemd's final kill
        assert agent.wait(timeout=60) == -signal.SIGKILL
        after = readers(report)
    # Under way: the last verdict stands (a recheck must not flip a node), and status says a run is going.
    assert during["status"].returncode == 0 and during["status"].stdout.startswith("vouched: passed")
    assert f"a run started at {when} is under way" in during["status"].stdout
    assert during["npd"].returncode == 0 and during["slurm"].returncode == 0 and during["kube"].returncode == 0
    # Gone without a report: every reader, by the one rule.
    died = f"a run started at {when} did not finish"
    # After a pass of this boot, which a fresh look may build on (the prolog's does), and it says so.
    assert after["status"].returncode == 1 and re.fullmatch(rf"NOT vouched: {died} \(\d+ s ago\); the last run that finished passed \(\d+ s ago\)\n", after["status"].stdout)
    assert after["npd"].returncode == 1 and after["npd"].stdout.startswith(died) and len(after["npd"].stdout.encode()) <= 80
    assert after["slurm"].returncode == 1 and after["slurm"].stdout.startswith(f"not vouched: {died}")
    # No age: the reason stays put. A run that died decides no check: preflight's own trouble, drained for a person.
    assert f"'Reason=preflight [software] drain: {died}; the last run that finished passed'" in after["slurm"].stdout
    assert after["kube"].returncode == 1 and f"NOT vouched ({died}" in after["kube"].stdout and '"preflight/result": "fail"' in after["kube"].stdout
    assert report.read_bytes() == before  # the killed run wrote nothing over the last report
    # The next run starts clean: its report settles the record, and the node is vouched again.
    p = run_preflight(["run", "--profile", "cpu", "--only", "shm", "-q", "--report", str(report)])
    assert p.returncode == 0, p.stderr
    assert not run_record.path_for(report).exists()
    again = run_preflight(["status", "--report", str(report)])
    assert again.returncode == 0 and again.stdout.startswith("vouched: passed") and "under way" not in again.stdout


def test_a_sigtermed_run_keeps_the_last_figures_with_their_age_and_says_it_was_interrupted(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass", age=600)
    gate = Report.model_validate_json(report.read_bytes())
    with a_run(tmp_path, report) as (agent, lines):
        when = started_at(report)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 143
    said = "".join(lines)
    r = Report.model_validate_json(report.read_bytes())
    assert (r.verdict, r.exit_code, r.interrupted_by_signal) == ("error", 143, 15)  # it did not finish: it vouches for nothing
    by = {c.check: c for c in r.checks}
    for name in ("shm", "nccl"):  # what it finished is its own
        assert by[name].status.ok and "carried_from" not in by[name].details
    for name, status in (("bandwidth", "ERROR"), ("train", "SKIP")):  # what it did not finish keeps the gate's figures
        kept, old = by[name], next(c for c in gate.checks if c.check == name)
        assert kept.status == "PASS" and kept.measurements == old.measurements and kept.measurements
        assert kept.details["carried_from"] == gate.finished_at.isoformat() and kept.details["carried_level"] == "standard"
        assert kept.details["interrupted"]["status"] == status and "SIGTERM" in kept.details["interrupted"]["summary"]
    # The console: what was kept and how old it is, and a last line that says interrupted, not broken.
    assert re.search(rf"interrupted by SIGTERM: kept the results of the run of {re.escape(gate.finished_at.isoformat())}, \d+ s ago "
                     r"\(level standard\) for what this run did not finish: bandwidth PASS, train PASS", said), said
    assert re.search(r"^preflight: INTERRUPTED by SIGTERM \(profile cpu; [^;]*; 2 kept from an earlier run\) in .*, exit 143$", said, re.M), said
    assert "ERROR (" not in said and "broke" not in said
    assert not run_record.path_for(report).exists()  # the report speaks for the run now
    st = run_preflight(["status", "--report", str(report)])
    assert st.returncode == 1 and st.stdout.startswith(f"NOT vouched: a run started at {when} was interrupted by SIGTERM")
    page = run_preflight(["report", str(report), "--html", "-"])
    assert page.returncode == 0 and '<header class="banner interrupted" data-verdict="error"><h1>INTERRUPTED: ' in page.stdout
    assert "interrupted by SIGTERM while bandwidth ran" in page.stdout and "broke" not in page.stdout
    assert f"measured by the run of {gate.finished_at.isoformat()[:19]}, level standard" in page.stdout


# ---- a disk too full for the report: nothing says PASS of a run whose report is not written ----

RUN = " ".join([*fakes.PREFLIGHT, "run", "--profile", "cpu", "--only", "shm"])


def in_private_mounts(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300, env=clean_env())


def last_line(stderr: str) -> str:
    return stderr.rstrip("\n").rsplit("\n", 1)[-1]


@needs_root
def test_a_report_the_disk_cannot_take_leaves_no_pass_in_the_textfile_or_on_the_console(tmp_path):
    out, metrics = tmp_path / "out", tmp_path / "metrics"
    out.mkdir(), metrics.mkdir()
    # The report's disk is full (one 4 KiB page, the previous report's); the textfile's has room.
    p = in_private_mounts(f"mount -t tmpfs -o size=4k tmpfs {out} && echo previous > {out}/report.json && "
                          f"{RUN} --report {out}/report.json --textfile-dir {metrics}; echo rc=$?; cat {out}/report.json; ls -A {out}")
    assert p.stdout.splitlines() == ["rc=3", "previous", "report.json"], p.stderr  # the previous report, and nothing else
    assert "could not write the report to" in p.stderr and "Traceback" not in p.stderr
    assert re.fullmatch(r"preflight: ERROR \(profile cpu; 1 pass\) in .*, exit 3", last_line(p.stderr)), p.stderr
    prom = (metrics / "preflight.prom").read_text()
    assert "preflight_run_passed 0.0" in prom and "preflight_run_exit_code 3.0" in prom


@needs_root
def test_a_textfile_never_says_pass_of_a_run_whose_report_was_not_written(tmp_path):
    out, roomy = tmp_path / "out", tmp_path / "roomy"
    out.mkdir(), roomy.mkdir()
    assert run_preflight([*RUN.split()[len(fakes.PREFLIGHT):], "--textfile-dir", str(roomy)]).returncode == 0
    # With room for a few more bytes than the roomy run's textfile: this run's figures print to other
    # lengths, and one past a page boundary found no room (seen under load). The report (4.5 KiB, two
    # pages) still cannot fit in what that leaves.
    pages = -(-((roomy / "preflight.prom").stat().st_size + 256) // 4096)
    # One disk for both, with room for the run's record (a page) and the textfile only: the textfile is
    # written beside its name, the report finds no room, and the textfile put in place says the ERROR.
    size = 4096 * (1 + 1 + pages)  # the previous report, the record, the textfile
    p = in_private_mounts(f"mount -t tmpfs -o size={size} tmpfs {out} && echo previous > {out}/report.json && "
                          f"{RUN} --report {out}/report.json --textfile-dir {out}; echo rc=$?; cat {out}/report.json; ls -A {out}; "
                          f"grep -h '^preflight_run_passed ' {out}/preflight.prom")
    assert p.stdout.splitlines() == ["rc=3", "previous", "preflight.prom", "report.json", "report.json.started", "preflight_run_passed 0.0"], p.stderr
    assert re.fullmatch(r"preflight: ERROR \(profile cpu; 1 pass\) in .*, exit 3", last_line(p.stderr)), p.stderr


@needs_root
def test_a_textfile_the_disk_cannot_take_makes_the_report_an_error(tmp_path):
    out, metrics = tmp_path / "out", tmp_path / "metrics"
    out.mkdir(), metrics.mkdir()
    p = in_private_mounts(f"mount -t tmpfs -o size=4k tmpfs {metrics} && head -c 4096 /dev/zero > {metrics}/filler; "
                          f"{RUN} --report {out}/report.json --textfile-dir {metrics}; echo rc=$?")
    assert p.stdout.splitlines() == ["rc=3"] and "could not write the metrics to" in p.stderr, p.stderr
    r = Report.model_validate_json((out / "report.json").read_bytes())
    assert (r.verdict, r.exit_code, r.last_success_at) == ("error", 3, None)  # no pass to remember either
    assert re.fullmatch(r"preflight: ERROR \(profile cpu; 1 pass\) in .*, exit 3", last_line(p.stderr)), p.stderr
    assert run_preflight(["status", "--report", str(out / "report.json")]).returncode == 1


def test_bad_input_found_once_the_run_has_started_leaves_no_record(tmp_path):
    # Found after the lock, when the node's shape is read: one line, exit 2, nothing written, the record included.
    fake = Path(__file__).parents[1] / "fixtures" / "nvml" / "h100-sxm-8x-healthy.json"
    p = run_preflight(["run", "--nvml-fake", str(fake), "--nproc-per-node", "16", "--report", str(tmp_path / "r.json")])
    assert p.returncode == 2 and "give at most 8" in p.stderr and list(tmp_path.iterdir()) == []


# ---- another run holding the lock ---------------------------------------------------------


def env_with(lock) -> dict[str, str]:
    return {**clean_env(), "PREFLIGHT_LOCK_FILE": str(lock)}


def test_skip_when_locked_exits_0_writes_nothing_and_says_who_holds_it(tmp_path):
    lock, report, textfile = tmp_path / "preflight.lock", tmp_path / "report.json", tmp_path / "textfile"
    report.write_text("the last verdict\n")
    textfile.mkdir()
    with lock_held(lock) as holder:
        p = run_preflight(["run", "--profile", "cpu", "--level", "quick", "--lock-timeout", "0.5", "--if-locked", "skip", "-q",
                           "--report", str(report), "--textfile-dir", str(textfile)], env=env_with(lock))
        assert p.returncode == 0, p.stderr
        # Said even with -q, in one line: nothing was judged, and the holder writes the verdict.
        assert p.stderr == (f"preflight: not run: another preflight run (pid {holder}) still holds {lock} after 0.5 s; "
                            "the last report stands, and that run writes its own verdict\n")
        assert report.read_text() == "the last verdict\n" and list(textfile.iterdir()) == []
        # Without it, the same wait ends as it always did: exit 2, naming the holder.
        p = run_preflight(["run", "--profile", "cpu", "--level", "quick", "--lock-timeout", "0.5", "--if-locked", "error",
                           "--report", str(report)], env=env_with(lock))
        assert p.returncode == 2 and f"another preflight run (pid {holder}) holds {lock}; waited 0.5 s" in p.stderr
        assert report.read_text() == "the last verdict\n"


def test_skip_when_locked_still_waits_and_runs_once_the_holder_lets_go(tmp_path):
    lock, report = tmp_path / "preflight.lock", tmp_path / "report.json"
    with lock_held(lock) as holder:
        run = subprocess.Popen([*fakes.PREFLIGHT, "run", "--profile", "cpu", "--level", "quick", "--lock-timeout", "120", "--if-locked", "skip",
                                "--report", str(report)], env=env_with(lock), stderr=subprocess.PIPE, text=True)
        try:
            for line in run.stderr:  # the run says it waits: now let the holder finish
                if line.startswith("preflight: waiting for"):
                    assert f"pid {holder}" in line
                    break
        except BaseException:
            run.kill()
            raise
    rest = run.communicate(timeout=120)[1]
    assert run.returncode == 0, rest
    assert "not run" not in rest and json.loads(report.read_text())["level"] == "quick"


def test_a_lock_that_cannot_be_opened_is_an_error_even_with_skip(tmp_path):
    (tmp_path / "file").write_text("")
    p = run_preflight(["run", "--profile", "cpu", "--level", "quick", "--if-locked", "skip", "--lock-file", str(tmp_path / "file" / "preflight.lock")])
    assert p.returncode == 2 and "is not a directory" in p.stderr and "not run" not in p.stderr


def test_if_locked_takes_error_or_skip_only(tmp_path):
    p = run_preflight(["run", "--profile", "cpu", "--if-locked", "wait", "--report", str(tmp_path / "r.json")])
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "--if-locked 'wait': say error (exit 2 when another run holds the lock) or skip" in p.stderr
    assert not (tmp_path / "r.json").exists()


@needs_root
def test_a_python_another_user_can_change_is_refused_unless_the_site_accepts_it(tmp_path):
    # Root runs it: whoever owns it, or can write where it lies, decides what root does.
    venv = tmp_path / "team-venv"
    venv.mkdir()
    python = venv / "python"
    ran = tmp_path / "ran-as-root"
    python.write_text(f'#!/bin/sh\ntouch "{ran}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    os.chown(python, 65534, 65534)
    args = ["run", "--profile", "cpu", "--only", "shm,nccl", "--python", str(python), "--report", str(tmp_path / "r.json")]
    p = run_preflight(args)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert (f"preflight: error: the workers' Python {python} would run as root, and another user decides what it does ({python} is nobody's): "
            "give root a Python no other user can change") in p.stderr
    assert "set python_of_another_user = true in the config" in p.stderr
    assert not ran.exists() and not (tmp_path / "r.json").exists()  # nothing ran it, nothing written
    conf = tmp_path / "config.toml"
    conf.write_text("python_of_another_user = true\n")
    p = run_preflight([*args, "--config", str(conf)])
    assert p.returncode == 0, p.stderr
    assert f"preflight: warning: the workers' Python {python} runs as root, and another user decides what it does: {python} is nobody's" in p.stderr
    assert ran.exists()


def quick_cuda_run(tmp_path: Path, lock: Path):
    """`preflight run --level quick --only cuda` on the healthy 8x H100 facts, in this process (its NVML reads counted by the caller)."""
    from typer.testing import CliRunner

    from preflight.cli.app import app

    fake = Path(__file__).parents[1] / "fixtures" / "nvml" / "h100-sxm-8x-healthy.json"
    return CliRunner().invoke(app, ["run", "--nvml-fake", str(fake), "--level", "quick", "--only", "cuda", "--lock-file", str(lock),
                                    "--lock-timeout", "120", "--report", str(tmp_path / "report.json")])


def test_a_run_that_waited_for_the_lock_reads_nvml_again_once_the_holder_lets_go(tmp_path, monkeypatch):
    """What NVML said before the wait is of a node another run was using (its processes on
    the GPUs, its clocks under its load): the checks judge one reading taken after it."""
    from conftest import HOLD_LOCK
    from preflight.outputs import gate
    from preflight.readers.nvidia import nvml

    said: list[str] = []
    inventory, take_lock = nvml.inventory, gate.run_lock
    monkeypatch.setattr(nvml, "inventory", lambda *a, **kw: said.append("read") or inventory(*a, **kw))
    lock = tmp_path / "preflight.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"

        def lock_seen_waiting(path, timeout, on_wait):
            def waiting(who: str) -> None:
                on_wait(who)
                said.append("waited")
                holder.stdin.close()  # the holder's run is done: it lets go
            return take_lock(path, timeout, waiting)

        monkeypatch.setattr(gate, "run_lock", lock_seen_waiting)
        r = quick_cuda_run(tmp_path, lock)
    finally:
        holder.kill()
        holder.wait()
    assert r.exit_code == 1 and "NVML facts are FAKE" in r.stderr, r.output  # fake facts never vouch for a node
    assert said == ["read", "waited", "read"]  # detection's reading, then one for the shape and every check


def test_a_run_whose_nvml_reading_another_run_held_the_node_through_reads_it_again(tmp_path, monkeypatch):
    """The other run lets go between this run's reading and its turn at the lock: the lock is
    free when asked, so nothing waited, yet the reading is of that run's node."""
    from conftest import HOLD_LOCK
    from preflight.outputs import gate
    from preflight.readers.nvidia import nvml

    said: list[str] = []
    inventory, plan = nvml.inventory, gate.pipeline.plan
    monkeypatch.setattr(nvml, "inventory", lambda *a, **kw: said.append("read") or inventory(*a, **kw))
    lock = tmp_path / "preflight.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"

        def planned_as_the_holder_lets_go(s, reading=None):
            made = plan(s, reading)
            holder.stdin.close()  # its run is done just as this one's plan is
            holder.wait()
            said.append("released")
            return made

        monkeypatch.setattr(gate.pipeline, "plan", planned_as_the_holder_lets_go)
        r = quick_cuda_run(tmp_path, lock)
    finally:
        holder.kill()
        holder.wait()
    assert r.exit_code == 1 and "NVML facts are FAKE" in r.stderr, r.output
    assert "waiting for" not in r.stderr  # the lock was free when asked
    assert said == ["read", "released", "read"]


def test_whether_a_run_holds_the_lock_is_read_from_the_kernel_without_touching_it(tmp_path):
    from conftest import HOLD_LOCK
    from preflight.pipeline import lock

    path = tmp_path / "preflight.lock"
    assert lock.held(path) is False  # no file: no run
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        before = path.stat()
        assert lock.held(path) is True
        assert path.stat().st_mtime_ns == before.st_mtime_ns  # nothing written
    finally:
        holder.stdin.close()
        holder.wait()
    assert lock.held(path) is False
    assert lock.held(path, locks=str(tmp_path / "no-such-table")) is None


def test_a_lock_of_another_file_with_the_same_inode_number_is_not_a_run(tmp_path):
    """Anyone may flock a file of theirs, or of sysfs, whose inode number is the lock's on
    another filesystem: /proc/locks shows the number alone. The holder's pid, which a run writes
    into the lock, tells the two apart, so no user can make every run wait and read NVML twice."""
    from preflight.pipeline import lock

    path = tmp_path / "preflight.lock"
    with lock.run_lock(path, 0):
        pass  # this process's pid is in it now, as the last holder's
    table = tmp_path / "locks"  # /proc/locks as the kernel would show the other lock
    ino = path.stat().st_ino
    stranger = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        table.write_text(f"1: FLOCK  ADVISORY  WRITE {stranger.pid} 00:15:{ino} 0 EOF\n")  # its own file, the same number
        assert lock.held(path, locks=str(table)) is False
    finally:
        stranger.communicate(b"", timeout=30)
    table.write_text(f"1: FLOCK  ADVISORY  WRITE {os.getpid()} fe:00:{ino} 0 EOF\n")
    assert lock.held(path, locks=str(table)) is True


def test_a_holder_whose_pid_the_lock_does_not_say_still_holds_it(tmp_path):
    """A pid unsaid (/run full when the holder took it) or said in another pid namespace: the
    holder's open files say it holds the lock, so the run reads NVML again once it is free."""
    from conftest import HOLD_LOCK
    from preflight.pipeline import lock

    path = tmp_path / "preflight.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with open(path, "r+b") as f:
            f.write(b"1         \n")  # not the holder's pid
        assert lock.held(path) is True
    finally:
        holder.stdin.close()
        holder.wait()


def test_a_lock_file_with_a_second_name_is_refused_and_nothing_is_written_through_it(tmp_path):
    """Where hard links to others' files are allowed (fs.protected_hardlinks=0), another user can
    make the lock's name a second name of a file of root's: the pid would be written over it."""
    from preflight.pipeline import lock

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious data\n")
    victim.chmod(0o600)
    os.link(victim, tmp_path / "preflight.lock")
    with pytest.raises(UsageError, match=r"has 2 names \(hard links\)"):
        with lock.run_lock(tmp_path / "preflight.lock", 0):
            pass
    assert victim.read_bytes() == b"precious data\n"


def test_a_fault_in_judging_the_history_costs_the_run_neither_its_verdict_nor_its_history_file(tmp_path, monkeypatch):
    """The checks all ran: a bug in the history's judge is one line and a SKIP, and the run
    is not added to a history it could not judge (the report is still written)."""
    import io

    from conftest import REPORTS

    from preflight.outputs import gate
    from preflight.outputs.record import history_judge
    from preflight.outputs.exporters.console import Console
    from preflight.pipeline.settings import Settings

    def broken(*_: object, **__: object):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(history_judge, "of_report", broken)
    report = Report.model_validate_json((REPORTS / "cpu-pass.json").read_text())
    out = io.StringIO()
    assert gate.judge_history(report, tmp_path / "history.db", None, Settings(), Console(stream=out)) is False
    assert report.history.status == "SKIP" and "ZeroDivisionError('a bug')" in report.history.summary and report.verdict == "pass"
    assert out.getvalue().count("\n") == 1 and "history not judged: preflight broke judging it (ZeroDivisionError('a bug'))" in out.getvalue()
    assert report.action == "none" and not (tmp_path / "history.db").exists()


def test_a_signal_while_the_history_is_judged_still_writes_the_report(tmp_path, monkeypatch):
    # Every check ran; SQLite may wait seconds on a locked history, and a SIGTERM then must not
    # cost the node its verdict: the report is written, then the run ends as interrupted.
    from preflight.base.errors import Interrupted
    from preflight.outputs import gate
    from preflight.outputs.record import history
    from preflight.outputs.exporters.console import Console
    from preflight.pipeline.settings import Settings

    def stopped(*_: object, **__: object):
        raise Interrupted(15)

    monkeypatch.setattr(history, "read", stopped)
    report = tmp_path / "report.json"
    s = Settings(profile="cpu", only=["shm"], report=report, lock_file=tmp_path / "lock")
    with pytest.raises(Interrupted):
        gate.run(s, Console(stream=io.StringIO()))
    written = Report.model_validate_json(report.read_bytes())
    assert written.verdict == "pass" and written.history.status == "SKIP" and written.history.summary == "history not judged: interrupted by SIGTERM"
    assert not (tmp_path / "history.db").exists()
