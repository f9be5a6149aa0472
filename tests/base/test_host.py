import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from preflight.base import host
from preflight.base.host import Host


def test_run_returns_output_and_exit_code():
    done = Host().run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (done.returncode, done.stdout, done.stderr, done.timed_out) == (3, "out\n", "err\n", False)


def test_run_kills_the_whole_group_at_the_deadline(tmp_path):
    pid_file = tmp_path / "grandchild"
    start = time.monotonic()
    done = Host().run(["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], timeout=0.5)
    assert done.timed_out and done.returncode is None
    assert time.monotonic() - start < 2.4  # the deadline, plus at most the SIGTERM grace
    pid = int(pid_file.read_text())  # the grandchild went with its group: gone, or dead and not yet reaped by PID 1
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_grandchild_in_a_session_of_its_own_neither_stalls_nor_survives(tmp_path):
    pid_file = tmp_path / "escaped"
    start = time.monotonic()
    done = Host().run(["sh", "-c", f"setsid sleep 300 & echo $! > {pid_file}; sleep 300"], timeout=0.5)
    assert done.timed_out and time.monotonic() - start < 5
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_paths_live_under_the_root(tmp_path):
    (tmp_path / "proc" / "sys" / "kernel" / "random").mkdir(parents=True)
    (tmp_path / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text("abc\n")
    host = Host(root=tmp_path, environ={})
    assert host.path("/dev/shm") == tmp_path / "dev" / "shm"
    assert host.boot_id() == "abc"
    assert Host(root=tmp_path / "empty").boot_id() is None


def test_run_gives_tools_the_c_locale_and_no_terminal(monkeypatch):
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    monkeypatch.setenv("LC_NUMERIC", "de_DE.UTF-8")
    monkeypatch.setenv("TERM", "xterm-256color")
    done = Host().run(["sh", "-c", 'echo "$LC_ALL $LANG $TERM $NO_COLOR ${LC_NUMERIC-unset}"; [ -t 0 ] || echo no-tty'], timeout=10)
    assert done.stdout == "C C dumb 1 unset\nno-tty\n"


def test_run_hands_readers_text_without_terminal_control_sequences():
    done = Host().run(["printf", "\\t\\033[4mGPU0\\tCPU Affinity\\033[0m\\r\\nGPU0\\t X \\t0-15\\n\\033[31merr\\033[0m\\n\\377"], timeout=10)
    assert done.stdout == "\tGPU0\tCPU Affinity\nGPU0\t X \t0-15\nerr\n\ufffd"


def test_a_process_seen_earlier_whose_pid_was_reused_is_never_killed():
    # The process looked at before has ended and its pid now names another process (here: the
    # same pid, told apart by its start time, as psutil tells them): that one is left alone.
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        seen = psutil.Process(other.pid)
        seen._ident = (other.pid, seen.create_time() - 100.0)  # how psutil knows a process: pid and start time
        assert not seen.is_running()
        assert host.kill_processes([seen]) == [] and other.poll() is None
        host.kill_processes([psutil.Process(other.pid)])  # seen now: killed, with its group (and reaped)
        other.wait(5)
        assert not psutil.pid_exists(other.pid)
    finally:
        other.kill()
        other.wait()


def test_a_tool_dies_with_a_killed_agent_though_its_deadline_is_far(tmp_path):
    # SIGKILL (the OOM killer) runs no deadline: a tool hung on a wedged driver would stay for ever.
    agent = (f"import sys; sys.path.insert(0, {str(Path(host.__file__).parents[2])!r})\n"
             "from preflight.base.host import Host\n"
             "started = Host().start(['sh', '-c', 'echo $$; exec sleep 60'])\n"
             "print(started.proc.stdout.readline().decode().strip(), flush=True)\n"
             "started.finish(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.PIPE, text=True)
    tool = int(proc.stdout.readline())
    assert psutil.pid_exists(tool)
    proc.kill()
    proc.wait()
    time.sleep(1.0)
    assert not psutil.pid_exists(tool) or psutil.Process(tool).status() == psutil.STATUS_ZOMBIE


def test_a_tool_found_in_the_working_directory_through_an_empty_path_entry_is_never_run(tmp_path, monkeypatch):
    # PATH=":/usr/bin" (or "." in it) makes the working directory, a /tmp where anyone may have put
    # a `journalctl` of theirs, the first place a tool is looked up: root ran nobody's file there.
    import shutil

    import pytest

    ran = tmp_path / "ran"
    for tool in ("journalctl", "ls"):
        planted = tmp_path / tool
        planted.write_text(f"#!/bin/sh\ntouch {ran}\n")
        planted.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    for path in (f":{Path(sys.executable).parent}:/usr/bin:/bin", f".:/usr/bin:/bin"):
        monkeypatch.setenv("PATH", path)
        exe = shutil.which("journalctl", path=path)  # as the readers look a tool up: a path in the working directory
        with pytest.raises(OSError):
            Host().run([exe if os.sep in exe else f"./{exe}", "-k"], timeout=10)
        # By name, only the PATH entries from the root are searched: the real tool runs, never the planted one.
        assert Host().run(["ls", str(tmp_path)], timeout=10).returncode == 0
        assert not ran.exists()
    # A tool given by its full path, or found in a PATH entry that is one, runs as before.
    assert Host().run([str(tmp_path / "journalctl")], timeout=10).returncode == 0 and ran.exists()
