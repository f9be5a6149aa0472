import subprocess
import sys
import time

import pytest

from preflight.base.errors import UsageError
from preflight.pipeline.lock import LockHeld, run_lock

HOLD = "import fcntl, os, sys, time; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); f.write(str(os.getpid())); f.flush(); print('held', flush=True); time.sleep(float(sys.argv[2]))"


def hold(path, seconds):
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


def test_second_run_waits_then_gives_up_naming_the_holder(tmp_path):
    lock = tmp_path / "preflight.lock"
    holder = hold(lock, 30)
    try:
        waited = []
        start = time.monotonic()
        with pytest.raises(UsageError, match=rf"another preflight run \(pid {holder.pid}\) holds .*; waited 0.5 s") as refused:
            with run_lock(lock, 0.5, waited.append):
                pass
        assert isinstance(refused.value, LockHeld) and refused.value.holder == f"pid {holder.pid}"  # what --if-locked skip names
        assert 0.5 <= time.monotonic() - start < 5
        assert waited == [f"pid {holder.pid}"]
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_taken_as_soon_as_the_holder_ends(tmp_path):
    lock = tmp_path / "preflight.lock"
    holder = hold(lock, 0.5)
    start = time.monotonic()
    with run_lock(lock, 30):
        assert time.monotonic() - start < 10
        assert lock.read_text().strip() != str(holder.pid)
    holder.wait()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    lock = tmp_path / "preflight.lock"
    holder = hold(lock, 60)
    holder.kill()
    holder.wait()
    with run_lock(lock, 0):
        pass


def test_an_unusable_lock_path_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"lock file .*: cannot open"):
        with run_lock(tmp_path / "file" / "preflight.lock", 0):
            pass
