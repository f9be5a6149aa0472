"""base/tether.py for real: children that die with the agent (and only then), and a
network of the launch's own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from preflight.base import tether

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="root makes the network namespace directly")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_missing_or_unrunnable_command_raises_as_popen_would(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        tether.popen(["/nonexistent/python"])
    with pytest.raises(FileNotFoundError):
        tether.popen(["no-such-command-here"])
    plain = tmp_path / "script"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    with pytest.raises(PermissionError):
        tether.popen([str(plain)])


def test_a_child_started_from_a_thread_that_ends_outlives_the_thread() -> None:
    # The parent-death signal follows the thread that forked: a check's thread ends while
    # the launch it started serves the next check, so the launch must not die with it.
    box = {}
    t = threading.Thread(target=lambda: box.update(proc=tether.popen(["sleep", "30"])))
    t.start()
    t.join()
    time.sleep(0.5)
    try:
        assert box["proc"].poll() is None
    finally:
        box["proc"].kill()
        box["proc"].wait()


def test_a_child_dies_within_a_second_of_its_agent(tmp_path: Path) -> None:
    agent = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(tether.__file__).parents[2])!r})
        from preflight.base import tether
        p = tether.popen(["sleep", "60"], start_new_session=True)
        print(p.pid, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    assert alive(child)
    assert psutil.Process(child).environ()[tether.AGENT_ENV] == tether.agent_mark(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    assert not alive(child), "the child, in a session of its own, outlived its agent"


def test_an_agent_mark_names_one_process_for_the_boot() -> None:
    me = tether.agent_mark()
    assert me.startswith(f"{os.getpid()}:") and tether.mark_alive(me)
    assert not tether.mark_alive(f"{os.getpid()}:1")  # the same pid, another start: a reused pid
    assert not tether.mark_alive("999999999:5")


@needs_root
def test_a_private_network_holds_only_a_loopback_that_is_up(tmp_path: Path) -> None:
    report = tmp_path / "isolation.json"
    probe = ("import json, socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
             "c = socket.create_connection(s.getsockname(), timeout=5); "
             "print(json.dumps([n for _, n in socket.if_nameindex()]))")
    p = tether.popen([sys.executable, "-c", probe], private_net=True, report=str(report), stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0
    assert json.loads(out) == ["lo"]
    assert tether.isolation(str(report)) == {"network": "private"}


def test_a_child_inherits_the_descriptors_held_for_it(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    tether.hold(fd)
    try:
        p = tether.popen([sys.executable, "-c", f"import os; os.fstat({fd})"])
        assert p.wait(60) == 0
        tether.release(fd)
        p = tether.popen([sys.executable, "-c", f"import os; os.fstat({fd})"], stderr=subprocess.DEVNULL)
        assert p.wait(60) != 0
    finally:
        tether.release(fd)
        os.close(fd)


@needs_root
@pytest.mark.skipif(not shutil.which("setpriv"), reason="util-linux's setpriv drops the capability")
def test_without_net_admin_the_launch_runs_on_the_hosts_network_and_says_why(tmp_path: Path) -> None:
    # Root with CAP_SYS_ADMIN but not CAP_NET_ADMIN (`docker run --cap-add SYS_ADMIN`) gets a
    # namespace whose loopback it cannot bring up: it must go back, not start ranks there.
    report = tmp_path / "isolation.json"
    agent = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(tether.__file__).parents[2])!r})
        from preflight.base import tether
        p = tether.popen([sys.executable, "-c", "import socket; print(sorted(n for _, n in socket.if_nameindex()))"],
                         private_net=True, report={str(report)!r})
        sys.exit(p.wait())
    """)
    done = subprocess.run(["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin", sys.executable, "-c", agent],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() != "['lo']"  # the host's interfaces
    said = tether.isolation(str(report))
    assert said["network"] == "host" and "loopback could not be brought up" in said["why"]
