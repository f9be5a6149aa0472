"""One run at a time: a boot unit, a timer and a person must not run GPU work at once.

An flock on one open file description: the kernel releases it when the last
descriptor of it closes, so a killed run leaves no stale lock, and whatever
inherits the descriptor holds the lock as long as it lives.

No other user can hold it or aim it elsewhere. The file is root's (the
runner's), 0600, so no one else can open it at all: flock works on a read-only
descriptor, and a lock others could open is a lock others could hold, which
makes every run exit 2 and a Slurm prolog drain a healthy node. It is opened
with O_NOFOLLOW in a directory reached without a link another user could
have made, and never truncated. By default it lives in /run/preflight
(created 0755, refused if another user owns it or others can write it); a
user who is not root gets a directory of their own.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from preflight.base import pathtrust, safefile, tether
from preflight.base.errors import UsageError

ROOT_DIR = Path("/run/preflight")
NAME = "preflight.lock"
PID_WIDTH = 10  # the holder's pid, padded, at offset 0: rewritten in place, never truncated
_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def default_path(euid: int | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """Root: /run/preflight/preflight.lock. Anyone else: their runtime directory
    (``$XDG_RUNTIME_DIR``, theirs alone), else /tmp/preflight-UID/, as tmux does."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return ROOT_DIR / NAME
    runtime = (os.environ if environ is None else environ).get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/"):
        return Path(runtime) / NAME
    return Path("/tmp") / f"preflight-{euid}" / NAME


def named(flag: Path | None, environ: Mapping[str, str] | None = None) -> Path:
    """The lock's path as the flag or the environment names it, before the settings are read (a
    config file may name another): ``--lock-file``, else PREFLIGHT_LOCK_FILE in any case, as
    pydantic-settings matches it, else ``default_path``."""
    if flag is not None:
        return flag
    env = os.environ if environ is None else environ
    given = next((v for k, v in env.items() if k.upper() == "PREFLIGHT_LOCK_FILE" and v), None)
    return Path(given) if given else default_path(environ=env)


def _refuse(path: Path, why: str) -> UsageError:
    return UsageError(f"lock file {path}: {why}")


def _directory(path: Path) -> int:
    """The lock's directory, made (one level) if missing, as an O_PATH descriptor;
    refused where another user could replace what is in it."""
    default = path == default_path()
    fix = ("remove it (preflight makes it anew) or give --lock-file" if default
           else f"give --lock-file in a directory only you can write, such as the default {default_path()}")
    try:
        with pathtrust.locate(path.parent, follow_last=False) as place:
            if place.st is None:
                try:  # root's is 0755 for anyone to see who holds it; a user's own, theirs alone
                    os.mkdir(place.name, 0o755 if os.geteuid() == 0 else 0o700, dir_fd=place.dir_fd)
                except FileExistsError:
                    pass
            elif stat.S_ISLNK(place.st.st_mode):
                raise _refuse(path, f"its directory {path.parent} is a symlink, and the lock is never reached through one; {fix}")
            fd = os.open(place.name, pathtrust.DIR_FLAGS, dir_fd=place.dir_fd)
    except pathtrust.Untrusted as e:
        raise _refuse(path, f"{e.strerror}; {fix}") from None
    except OSError as e:
        where = e.filename if e.errno == errno.ENOENT and e.filename else path.parent
        what = "is not a directory" if e.errno in (errno.ENOTDIR, errno.ELOOP) else e.strerror.lower() if e.strerror else str(e)
        raise _refuse(path, f"{where}: {what}; {fix}") from None
    st = os.fstat(fd)
    why = None
    if st.st_uid not in (0, os.geteuid()):
        why = f"its directory {path.parent} is {pathtrust.owner(st.st_uid)}'s, who could replace the lock"
    elif st.st_mode & _OTHERS and (default or not st.st_mode & stat.S_ISVTX):
        # Sticky (/tmp): others cannot replace our file there, and one of theirs is refused below.
        why = f"other users can write its directory {path.parent} (mode {stat.S_IMODE(st.st_mode):04o}), so they could replace the lock"
    if why:
        os.close(fd)
        raise _refuse(path, f"{why}; {fix}")
    return fd


def _open(path: Path, d: int) -> int:
    """The lock file, ours and 0600, opened read-write without following a link."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(pathtrust.MAX_STEPS):
        try:
            fd = os.open(path.name, flags, dir_fd=d)
        except FileNotFoundError:
            try:
                return os.open(path.name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=d)
            except FileExistsError:
                continue  # another run made it first
            except OSError as e:
                raise _refuse(path, f"cannot create it ({e.strerror}); choose a path you can write (--lock-file)") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _refuse(path, "is a symlink, which another user may have planted; remove it, or choose another --lock-file") from None
            raise _refuse(path, f"cannot open ({e.strerror}); choose a path you can write (--lock-file)") from None
        st = os.fstat(fd)
        why = ("is not a regular file" if not stat.S_ISREG(st.st_mode)
               else f"is {pathtrust.owner(st.st_uid)}'s, who could hold it and stop every run" if st.st_uid != os.geteuid()
               # A name another user linked to a file of ours: the holder's pid would be written over that file.
               else f"has {st.st_nlink} names (hard links), one of which another user may have made" if st.st_nlink != 1 else None)
        if why:
            os.close(fd)
            raise _refuse(path, f"{why}; remove it, or choose another --lock-file in a directory only you can write")
        if st.st_mode & 0o077:
            # Others may have opened it while it was readable (an older preflight made it 0644) and
            # hold it still: lock a fresh 0600 file in its place; their descriptor keeps the old one.
            os.close(fd)
            tmp, fd = safefile.create_temp(d, path.name)
            os.replace(tmp, path.name, src_dir_fd=d, dst_dir_fd=d)
        return fd
    raise _refuse(path, "keeps changing while it is opened; choose another --lock-file")


class LockHeld(UsageError):
    """Another run still held the lock when the wait ran out (``run --if-locked skip`` ends here, exit 0)."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode(errors="replace").split("\n", 1)[0].strip()
        return f"pid {pid}" if pid.isdigit() else "another process"
    except OSError:
        return "another process"


def _still_named(d: int, name: str, fd: int) -> bool:
    """Whether the name still is the file we locked: a run that replaced a loose lock file, or
    one that raced us to it, leaves us holding a file no other run will open."""
    try:
        there = os.stat(name, dir_fd=d, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def held(path: Path, locks: str = "/proc/locks") -> bool | None:
    """Whether a run holds the lock at ``path`` now, from the kernel's table of locks and the
    pid its holder wrote: the file is only read, never made or locked (a run that holds it
    never sees this look). None: unknown."""
    try:
        st = os.stat(path, follow_symlinks=False)
        with open(locks) as f:
            table = f.read()
    except FileNotFoundError:
        return False if not path.exists() else None
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 19790 fe:00:2148151 0 EOF": the pid, the device in hex, the inode
    # in decimal. Matched on the inode, as on btrfs the device the kernel prints is not stat's, and
    # on the pid the holder wrote into the file: anyone may flock a file of theirs (or of sysfs)
    # that has the same inode number on another filesystem, which would make every run wait.
    pids = [row[4] for row in (line.split() for line in table.splitlines())
            if len(row) > 5 and row[1] == "FLOCK" and row[5].rsplit(":", 1)[-1] == str(st.st_ino)]
    if not pids:
        return False
    recorded = _recorded_pid(path)
    # A pid unsaid (a full /run) or said in another pid namespace: the holder's open files tell.
    if recorded is None or str(recorded) in pids:
        return True
    devices = {f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}".encode(), *_own_mount_device(path)}
    return any(_has_open(pid, st, os.path.realpath(path), devices) for pid in pids)


def _has_open(pid: str, st: os.stat_result, where: str, devices: set[bytes]) -> bool:
    """Whether process ``pid`` has the file ``st`` open, from its /proc fd table (unreadable: no).
    Read from fdinfo (the inode number and the mount of each descriptor, that mount's device from
    the process's mountinfo), never by a stat of /proc/PID/fd/N: that asks the file's own
    filesystem, and a user's FUSE file there that never answers left the run stuck in the kernel,
    where not even SIGKILL ends it. A kernel whose fdinfo gives no inode (before 5.14) is asked
    where each descriptor leads (readlink: the name the kernel keeps), ``where`` the lock's own.
    ``devices``: the lock's device as stat and as this process's mountinfo say it."""
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return False
    mounts: dict[bytes, bytes] | None = None
    for fd in fds:
        if (info := _fdinfo(pid, fd)) is None:
            continue
        if b"ino" in info and info[b"ino"] != str(st.st_ino).encode():
            continue
        if mounts is None and b"ino" in info:
            mounts = _mount_devices(pid)
        device = mounts.get(info.get(b"mnt_id", b"")) if mounts is not None else None
        # The mount's device as mountinfo says it (a bind mount in a container's namespace: the same).
        # A mount not in the holder's mountinfo is one it detached, which any user can, in a namespace of
        # theirs, holding a file of the lock's inode number there (and of the lock's name from that
        # mount's root): no holder of this lock. Only a hint either way: a run that finds the lock taken
        # after all waits for it (head_start).
        if b"ino" in info:
            if device in devices:
                return True
            continue
        # No inode in fdinfo (a kernel before 5.14): the name the kernel keeps for the descriptor decides.
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == where:
                return True
        except OSError:
            pass
    return False


def _own_mount_device(path: Path) -> list[bytes]:
    """The device of the mount this process reaches ``path`` through, as its mountinfo says it: on
    btrfs a file's st_dev is its subvolume's, which no mountinfo shows. Empty where it cannot be read."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        mnt = (_fdinfo("self", str(fd)) or {}).get(b"mnt_id")
    finally:
        os.close(fd)
    device = _mount_devices("self").get(mnt) if mnt is not None else None
    return [device] if device else []


def _fdinfo(pid: str, fd: str) -> dict[bytes, bytes] | None:
    """/proc/PID/fdinfo/FD's fields (pos, flags, mnt_id, ino, ...), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
            return {k.strip(): v.strip() for k, _, v in (line.partition(b":") for line in f.read(4096).splitlines())}
    except OSError:
        return None


def _mount_devices(pid: str) -> dict[bytes, bytes]:
    """Each mount id of the process's mount namespace and its device ("major:minor"), from
    /proc/PID/mountinfo; empty where it cannot be read."""
    try:
        with open(f"/proc/{pid}/mountinfo", "rb") as f:
            rows = [line.split() for line in f.read(1 << 22).splitlines()]
    except OSError:
        return {}
    return {row[0]: row[2] for row in rows if len(row) > 2}


def _recorded_pid(path: Path) -> int | None:
    """The pid the lock's last holder wrote into it (run_lock), or None where it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.pread(fd, PID_WIDTH + 1, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if text.isdigit() else None


@contextmanager
def run_lock(path: Path, timeout: float, on_wait: Callable[[str], None] = lambda _: None) -> Iterator[int]:
    """Hold an exclusive flock on ``path``, waiting up to ``timeout`` seconds for
    it; yields the descriptor. Bad paths are a UsageError (exit 2)."""
    d = _directory(path)
    try:
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            fd = _open(path, d)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        holder = _holder(fd)
                        if time.monotonic() >= deadline:
                            raise LockHeld(
                                f"another preflight run ({holder}) holds {path}; waited {timeout:g} s. "
                                "Wait for it to finish, or raise --lock-timeout",
                                holder,
                            ) from None
                        if not waited:
                            on_wait(holder)
                            waited = True
                        time.sleep(0.1)
                if _still_named(d, path.name, fd):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # locked a file since replaced: take the one the name holds now
        try:
            try:
                os.pwrite(fd, f"{os.getpid():<{PID_WIDTH}}\n".encode(), 0)
            except OSError:
                pass  # a full disk: the lock holds, only the holder's pid goes unsaid
            # Every launch holds it too (base/tether.py): the lock is not free while anything
            # this run started still lives, even after the agent itself was killed.
            tether.hold(fd)
            yield fd
        finally:
            tether.release(fd)
            os.close(fd)
    finally:
        os.close(d)
