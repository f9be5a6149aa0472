"""The launcher, for real: plain and torchrun workers, deadlines, and the sweep
that leaves no process behind. The workers are tests/fixtures/workers/ranks.py."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import needs_root, tmpdir_in_nobodys_home
from preflight.gpuwork import launch, launch_output, processes

RANKS = str(Path(__file__).parents[1] / "fixtures" / "workers" / "ranks.py")  # absolute: WORKERS_DIR / it is it


def marked_alive(running: launch.Running) -> list[int]:
    """Every live process that carries this launch's token: after wait() there must be none."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(processes.TOKEN_ENV) == running.token:
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


def run(worker: launch.Worker, timeout: float, settled=None) -> tuple[launch_output.Finished, list[int]]:
    running = launch.start(sys.executable, worker, timeout)
    done = running.wait(settled)
    return done, marked_alive(running)


def test_a_plain_worker_reports_as_rank_0():
    done, left = run(launch.Worker(RANKS), 30)
    assert done.returncode == 0 and not done.timed_out and done.endpoint is None
    assert done.reports[0]["world"] is None and done.rank_logs[0] == ["rank 0 of 1 started"]
    assert done.how_it_ended == "exit 0" and not left


def test_torchrun_starts_every_rank_on_a_loopback_endpoint():
    done, left = run(launch.Worker(RANKS, nproc=3), 60)
    assert done.returncode == 0, done.log_tail
    assert sorted(done.reports) == [0, 1, 2] and {r["world"] for r in done.reports.values()} == {"3"}
    assert done.endpoint.startswith("127.0.0.1:") and done.rank_logs[2] == ["rank 2 of 3 started"]
    assert not left


def test_a_rank_that_exits_or_is_killed_is_named_by_torchrun_s_summary():
    done, left = run(launch.Worker(RANKS, ["--rank", "1", "--do", "exit:3"], nproc=2), 60)
    assert done.returncode != 0 and done.rank_exits.get(1) == 3 and not left
    done, left = run(launch.Worker(RANKS, ["--rank", "1", "--do", "kill"], nproc=2), 60)
    assert done.rank_exits.get(1) == -9 and launch_output.exit_words(done.rank_exits[1]) == "killed by SIGKILL"
    assert not left


def test_a_hang_is_killed_at_the_deadline_with_everything_it_started():
    started = time.monotonic()
    done, left = run(launch.Worker(RANKS, ["--rank", "0", "--do", "daemon"]), 3)
    took = time.monotonic() - started
    assert done.timed_out and done.returncode is None and "killed at the deadline" in done.how_it_ended
    assert took < 3 + 10, took  # SIGTERM is ignored: the grace, then SIGKILL
    assert done.reports[0]["rank"] == 0  # what it said before hanging is kept
    assert not done.leftover and not left  # the setsid daemon too


def test_a_hung_torchrun_rank_in_its_own_session_is_swept():
    done, left = run(launch.Worker(RANKS, ["--rank", "1", "--do", "hang"], nproc=2), 8)
    assert done.timed_out and sorted(done.reports) == [0, 1]
    assert not done.leftover and not left


def test_settled_ends_the_wait_early():
    started = time.monotonic()
    done, left = run(launch.Worker(RANKS, ["--rank", "0", "--do", "hang"]), 60, lambda r: r.report(0) is not None)
    assert done.settled and not done.timed_out and done.returncode is None
    assert time.monotonic() - started < 10 and "no rank made progress" in done.how_it_ended
    assert not left


def test_an_unusable_tmpdir_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    with pytest.raises(launch.LaunchError) as e:
        launch.start(sys.executable, launch.Worker(RANKS), timeout=5)
    assert f"TMPDIR={tmp_path / 'missing'} is not usable (No such file or directory)" in e.value.cause
    assert "TMPDIR" in e.value.remedy


def test_a_tmpdir_another_user_could_swap_the_folder_in_is_refused(tmp_path, monkeypatch):
    # Writable by others and not sticky: they could rename the workers' folder away and put
    # one of theirs, full of links, in its place.
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    monkeypatch.setenv("TMPDIR", str(loose))
    with pytest.raises(launch.LaunchError) as e:
        launch.start(sys.executable, launch.Worker(RANKS), timeout=5)
    assert e.value.cause == f"TMPDIR={loose} could be replaced under the workers by another user: {loose} is writable by every user"
    assert not any(loose.iterdir())
    loose.chmod(0o1777)  # sticky, as /tmp: fine
    launch.start(sys.executable, launch.Worker(RANKS), timeout=5).wait()


@needs_root
def test_a_tmpdir_below_another_user_s_directory_is_refused(tmp_path, monkeypatch):
    # root's own tmp, but in a home another user owns: they rename tmp away and put one of
    # theirs there, whose worker folder holds launcher.log -> a file of root's.
    tmp, refusal = tmpdir_in_nobodys_home(tmp_path, monkeypatch)
    with pytest.raises(launch.LaunchError) as e:
        launch.start(sys.executable, launch.Worker(RANKS), timeout=5)
    assert e.value.cause == refusal and not any(tmp.iterdir())
    # A link to root's directory, its own in a sticky one: the link's owner could re-aim it.
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    (shared / "tmp").symlink_to(tmp_path)
    os.chown(shared / "tmp", 65534, 65534, follow_symlinks=False)
    monkeypatch.setenv("TMPDIR", str(shared / "tmp"))
    with pytest.raises(launch.LaunchError) as e:
        launch.start(sys.executable, launch.Worker(RANKS), timeout=5)
    assert e.value.cause.endswith(f"{shared / 'tmp'} is a symlink another user could re-aim (it is nobody's)")


def test_no_private_directory_is_left_behind(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    launch.start(sys.executable, launch.Worker(RANKS), timeout=30).wait()
    assert list(tmp_path.iterdir()) == []


def test_a_port_in_time_wait_after_a_killed_run_is_free_again():
    # A server socket that accepted a connection and closed first leaves TIME_WAIT behind.
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        cli = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        conn.close()
        cli.close()
    launch.check_port_free(port)  # no LaunchError: torchrun's store binds with SO_REUSEADDR too


def test_a_worker_imports_its_sibling_modules_even_under_pythonsafepath(monkeypatch, tmp_path):
    # Every real worker imports _rank.py from its own folder; PYTHONSAFEPATH takes that folder off sys.path.
    (tmp_path / "sibling.py").write_text("WORD = 'found'\n")
    (tmp_path / "worker.py").write_text(
        "import argparse, json, pathlib, sibling\n"
        "p = argparse.ArgumentParser(); p.add_argument('--out'); a = p.parse_args()\n"
        "pathlib.Path(a.out, 'rank0.json').write_text(json.dumps({'word': sibling.WORD}))\n"
    )
    monkeypatch.setenv("PYTHONSAFEPATH", "1")
    done, left = run(launch.Worker(str(tmp_path / "worker.py")), 30)
    assert done.returncode == 0 and done.reports[0] == {"word": "found"}, done.log_tail
    assert not left
