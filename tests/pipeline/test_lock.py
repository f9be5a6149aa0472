"""The run lock as real processes hold it: one run at a time, released by the
kernel when its holder dies; and, as user nobody tries, no other user can hold
it, plant it or move it."""

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import as_nobody, needs_nobody, needs_root
from preflight.base.errors import UsageError
from preflight.pipeline import lock
from preflight.pipeline.lock import LockHeld, run_lock

HOLD = ("import sys, time; from pathlib import Path; from preflight.pipeline.lock import run_lock\n"
        "with run_lock(Path(sys.argv[1]), 0):\n    print('held', flush=True); time.sleep(float(sys.argv[2]))")


def hold(path, seconds):
    """Another preflight run holding the lock."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "held\n"
    return p


@contextmanager
def held_unnamed(path):
    """Another run holding the lock, the pid in the file not its own (another pid namespace's)."""
    p = hold(path, 30)
    try:
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, f"{1:<{lock.PID_WIDTH}}\n".encode(), 0)  # pid 1: not the holder
        os.close(fd)
        yield p
    finally:
        p.kill()
        p.wait()


def secret(path: Path) -> Path:
    """A root file only root may read, for a planted link to point at."""
    path.write_bytes(b"root's own, 0600\n")
    path.chmod(0o600)
    return path


def unchanged(path: Path) -> bool:
    st = path.lstat()
    return path.read_bytes() == b"root's own, 0600\n" and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0


def test_second_run_waits_then_gives_up_naming_the_holder(tmp_path):
    path = tmp_path / "preflight.lock"
    holder = hold(path, 30)
    try:
        waited = []
        start = time.monotonic()
        with pytest.raises(UsageError, match=rf"another preflight run \(pid {holder.pid}\) holds .*; waited 0.5 s") as refused:
            with run_lock(path, 0.5, waited.append):
                pass
        assert isinstance(refused.value, LockHeld) and refused.value.holder == f"pid {holder.pid}"  # what --if-locked skip names
        assert 0.5 <= time.monotonic() - start < 5
        assert waited == [f"pid {holder.pid}"]
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_is_taken_as_soon_as_the_holder_ends(tmp_path):
    path = tmp_path / "preflight.lock"
    holder = hold(path, 0.5)
    start = time.monotonic()
    with run_lock(path, 30):
        assert time.monotonic() - start < 10
        assert path.read_text().strip() == str(os.getpid())
    holder.wait()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    path = tmp_path / "preflight.lock"
    holder = hold(path, 60)
    holder.kill()
    holder.wait()
    with run_lock(path, 0):
        pass


def test_an_unusable_lock_path_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"lock file .*/file/preflight.lock: .*/file: is not a directory; give --lock-file"):
        with run_lock(tmp_path / "file" / "preflight.lock", 0):
            pass
    with pytest.raises(UsageError, match=r"lock file .*/no/such/preflight.lock: .*/no: no such file or directory"):
        with run_lock(tmp_path / "no" / "such" / "preflight.lock", 0):
            pass


def test_the_file_is_made_0600_and_its_directory_0755_and_the_pid_is_written_in_place(tmp_path):
    path = tmp_path / "run" / "preflight.lock"
    with run_lock(path, 0):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755 & ~_umask()
    # Never truncated: the holder's pid overwrites the start of whatever is there.
    before = b"12345678901234567890 and more\n"
    path.write_bytes(before)
    with run_lock(path, 0):
        assert path.read_bytes() == f"{os.getpid():<10}\n".encode() + before[11:]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_the_default_is_root_s_own_directory_and_a_user_s_own_elsewhere():
    assert lock.default_path(0) == Path("/run/preflight/preflight.lock")
    assert lock.default_path(1000, {"XDG_RUNTIME_DIR": "/run/user/1000"}) == Path("/run/user/1000/preflight.lock")
    assert lock.default_path(1000, {}) == Path("/tmp/preflight-1000/preflight.lock")


def test_a_directory_others_can_write_without_the_sticky_bit_is_refused(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)  # anyone could rename the lock away and run beside us
    with pytest.raises(UsageError, match=r"other users can write its directory .*open \(mode 0777\)"):
        with run_lock(d / "preflight.lock", 0):
            pass
    assert os.listdir(d) == []


@needs_root
def test_the_default_directory_is_made_root_s_0755_and_refused_when_it_is_not(tmp_path):
    """/run as a private tmpfs: the default lock's directory made, then found loose or another user's."""
    script = tmp_path / "cases.py"
    script.write_text(
        "import json, os, shutil, stat\n"
        "from preflight.base.errors import UsageError\n"
        "from preflight.pipeline.lock import default_path, run_lock\n"
        "said = {}\n"
        "path = default_path()\n"
        "with run_lock(path, 0):\n"
        "    said['made'] = [oct(stat.S_IMODE(os.stat(p).st_mode)) for p in (path.parent, path)]\n"
        "for case, change in (('0777', lambda d: os.chmod(d, 0o777)), ('1777', lambda d: os.chmod(d, 0o1777)),\n"
        "                     ('nobody', lambda d: os.chown(d, 65534, 65534)), ('link', None)):\n"
        "    shutil.rmtree(path.parent)\n"
        "    if change is None:\n"
        "        os.mkdir('/run/elsewhere', 0o755)\n"
        "        os.symlink('/run/elsewhere', path.parent)\n"
        "    else:\n"
        "        os.mkdir(path.parent, 0o755)\n"
        "        change(path.parent)\n"
        "    try:\n"
        "        with run_lock(path, 0):\n"
        "            said[case] = 'taken'\n"
        "    except UsageError as e:\n"
        "        said[case] = str(e)\n"
        "    if change is None:\n"
        "        os.unlink(path.parent)\n"
        "        said['elsewhere'] = os.listdir('/run/elsewhere')\n"
        "print(json.dumps(said))\n")
    done = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o mode=0755 tmpfs /run && exec {shlex.quote(sys.executable)} {script}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["made"] == ["0o755", "0o600"]
    assert "other users can write its directory /run/preflight (mode 0777)" in said["0777"]
    assert "other users can write its directory /run/preflight (mode 1777)" in said["1777"]  # not even sticky: it is preflight's own
    assert "its directory /run/preflight is nobody's, who could replace the lock" in said["nobody"]
    assert "its directory /run/preflight is a symlink" in said["link"] and said["elsewhere"] == []
    for case in ("0777", "1777", "nobody", "link"):
        assert "remove it (preflight makes it anew) or give --lock-file" in said[case]


@needs_nobody
def test_a_symlink_nobody_planted_at_the_lock_path_is_refused_and_its_target_untouched(sticky, tmp_path):
    target = secret(tmp_path / "secret")
    assert as_nobody("ln", "-s", str(target), str(sticky / "preflight.lock")).returncode == 0
    with pytest.raises(UsageError, match=r"lock file .*preflight.lock: is a symlink, which another user may have planted"):
        with run_lock(sticky / "preflight.lock", 0):
            pass
    assert unchanged(target)


@needs_nobody
def test_a_link_nobody_planted_in_the_lock_s_directory_part_is_never_followed(sticky, tmp_path):
    root_only = tmp_path / "root-only"
    (root_only / "sub").mkdir(mode=0o700, parents=True)
    assert as_nobody("ln", "-s", str(root_only), str(sticky / "dir")).returncode == 0
    with pytest.raises(UsageError, match=r"/dir is a symlink another user could have made \(it is nobody's\)"):
        with run_lock(sticky / "dir" / "sub" / "preflight.lock", 0):
            pass
    with pytest.raises(UsageError, match=r"its directory .*/dir is a symlink, and the lock is never reached through one"):
        with run_lock(sticky / "dir" / "preflight.lock", 0):
            pass
    assert os.listdir(root_only) == ["sub"] and os.listdir(root_only / "sub") == []


@needs_nobody
def test_a_lock_file_another_user_made_is_refused(sticky):
    assert as_nobody("touch", str(sticky / "preflight.lock")).returncode == 0
    with pytest.raises(UsageError, match=r"is nobody's, who could hold it and stop every run"):
        with run_lock(sticky / "preflight.lock", 0):
            pass


@needs_nobody
def test_nobody_cannot_even_open_the_lock_a_run_holds(sticky):
    path = sticky / "preflight.lock"
    with run_lock(path, 0):
        tried = as_nobody("flock", "--nonblock", "--shared", str(path), "true")
        assert tried.returncode != 0 and "Permission denied" in tried.stderr
        tried = as_nobody("/usr/bin/python3", "-c", f"open({str(path)!r}, 'rb')")
        assert tried.returncode != 0 and "PermissionError" in tried.stderr


@needs_nobody
def test_a_read_only_descriptor_nobody_holds_on_a_readable_lock_stops_no_run(sticky):
    """An older preflight left the lock 0644: nobody opened it read-only and holds an
    flock on it (what made every run exit 2). A run locks a fresh 0600 file in its place."""
    path = sticky / "preflight.lock"
    path.write_text("1\n")
    path.chmod(0o644)
    holder = subprocess.Popen(["runuser", "-u", "nobody", "--", "flock", "--exclusive", str(path), "-c", "echo held; exec sleep 60"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with run_lock(path, 2):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert path.read_text().strip() == str(os.getpid())
        with run_lock(path, 0):  # and the next run takes the same fresh file
            pass
    finally:
        os.killpg(holder.pid, 9)
        holder.wait()


@needs_nobody
def test_a_user_who_is_not_root_gets_a_lock_of_their_own():
    """nobody, with no runtime directory, by hand: /tmp/preflight-65534, theirs alone,
    and refused in one line when another user made that directory first."""
    mine = Path("/tmp/preflight-65534")
    code = ("from preflight.base.errors import UsageError\n"
            "from preflight.pipeline.lock import default_path, run_lock\n"
            "try:\n"
            "    with run_lock(default_path(), 0):\n"
            "        print(default_path())\n"
            "except UsageError as e:\n"
            "    print(e)\n")
    here = str(Path(lock.__file__).parents[2])  # this checkout: stdlib and preflight.base only
    run = ["env", "-u", "XDG_RUNTIME_DIR", f"PYTHONPATH={here}", "/usr/bin/python3", "-c", code]
    if mine.exists():
        pytest.skip(f"{mine} exists already; remove it to run this test")
    try:
        done = as_nobody(*run)
        assert done.stdout.strip() == str(mine / "preflight.lock"), done.stderr
        assert (stat.S_IMODE(mine.stat().st_mode), mine.stat().st_uid) == (0o700, 65534)
        assert stat.S_IMODE((mine / "preflight.lock").stat().st_mode) == 0o600
        subprocess.run(["rm", "-r", str(mine)], check=True)
        mine.mkdir(mode=0o755)  # root's: nobody can make no lock in it
        done = as_nobody(*run)
        assert done.stdout.strip().startswith(f"lock file {mine}/preflight.lock: cannot create it (Permission denied)"), done.stderr
    finally:
        subprocess.run(["rm", "-rf", str(mine)])


def test_the_lock_stays_held_while_a_launch_of_the_run_lives(tmp_path):
    # A launch (base/tether.py) inherits the held lock: a run's ranks that outlived their
    # agent (stuck in the driver, say) keep the next run from starting beside them.
    from preflight.base import tether

    path = tmp_path / "preflight.lock"
    with run_lock(path, 0):
        child = tether.popen(["sleep", "60"])
    try:
        with pytest.raises(LockHeld):
            with run_lock(path, 0.3):
                pass
    finally:
        child.kill()
        child.wait()
    with run_lock(path, 5):
        pass


def test_held_tells_a_holder_from_its_descriptors_without_a_stat_through_them(tmp_path, monkeypatch):
    # A holder whose pid the file does not name (another pid namespace) is found by the files it
    # holds open. Never by stat()ing /proc/PID/fd/N: that asks each file's own filesystem, and a
    # user's FUSE file (user_allow_other) that never answers left every `preflight run` stuck in
    # the kernel before its first check, where not even SIGKILL ended it, once that user flocked a
    # file of theirs with the lock's inode number.
    path = tmp_path / "preflight.lock"
    with held_unnamed(path):
        real_stat = os.stat

        def no_stat_through_fds(target, *args, **kwargs):
            assert not (str(target).startswith("/proc/") and "/fd/" in str(target)), f"stat through {target}"
            return real_stat(target, *args, **kwargs)

        monkeypatch.setattr(os, "stat", no_stat_through_fds)
        assert lock.held(path) is True
        other = tmp_path / "other"
        other.write_text("")
        monkeypatch.setattr(lock, "_recorded_pid", lambda _: 1)
        assert lock.held(other) is False  # not locked at all
    monkeypatch.undo()
    assert lock.held(path) is False


def test_a_file_of_the_locks_inode_number_on_a_mount_its_holder_detached_is_no_holder(tmp_path, monkeypatch):
    # Any user can, in a namespace of theirs, flock a file with the lock's inode number on a tmpfs and
    # detach that mount: its descriptor's mount is then in no mountinfo. Matched on the inode alone, it
    # made every run take the lock for held by another run (no head start, NVML read twice).
    path = tmp_path / "preflight.lock"
    path.write_text(f"{1:<{lock.PID_WIDTH}}\n")  # pid 1: not the holder, as in another pid namespace
    decoy = tmp_path / "decoy"
    p = hold(decoy, 30)
    try:
        real_stat = os.stat
        seen = real_stat(decoy)

        def same_inode(target, *args, **kwargs):  # the lock file, with the decoy's inode number
            return seen if str(target) == str(path) else real_stat(target, *args, **kwargs)

        monkeypatch.setattr(os, "stat", same_inode)
        monkeypatch.setattr(lock, "_mount_devices", lambda pid: {})  # the holder's mount detached: unseen
        assert lock.held(path) is False
    finally:
        p.kill()
        p.wait()


def test_a_holder_is_found_where_the_lock_s_st_dev_is_no_mount_s_device(tmp_path, monkeypatch):
    # On btrfs a file's st_dev is its subvolume's, which no mountinfo shows: the lock's device is also
    # taken as this process's own mountinfo says it, so a holder in another pid namespace is still seen.
    path = tmp_path / "preflight.lock"
    with held_unnamed(path):
        real_stat = os.stat
        subvolume = os.makedev(0, 4242)

        def btrfs(target, *args, **kwargs):
            st = real_stat(target, *args, **kwargs)
            if str(target) != str(path):
                return st
            return os.stat_result((st.st_mode, st.st_ino, subvolume, *st[3:10]))

        monkeypatch.setattr(os, "stat", btrfs)
        assert lock.held(path) is True
