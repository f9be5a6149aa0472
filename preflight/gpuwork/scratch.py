"""The private directories launches work in, under $TMPDIR: made, owned while in use, and
swept once a killed run left them.

Each holds a launch's rank reports and logs (gpuwork/launch.py). The agent
flock's an ``owner.lock`` inside for as long as the directory is in use, so the
next launch can tell a killed run's directory (lock free) from a live one's and
remove it. A TMPDIR another user could swap the directory in (theirs, writable by others and
not sticky, or below a directory or link of theirs) is refused.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from preflight.base import pathtrust

PREFIX = "preflight-worker-"
OWNER = "owner.lock"  # flock'ed by the agent while the directory is in use
STALE_UNOWNED = 3600.0  # seconds: a directory with no owner file (an older preflight's) is left this long
NEW = ".preflight-new-"  # a directory's name until its lock is held


def make(error: type[Exception]) -> tuple[Path, int]:
    """A new private directory under $TMPDIR, and the descriptor whose flock says it is in use;
    ``error(cause, remedy)`` is raised where TMPDIR will not do. Directories that killed runs
    left there are removed first."""
    # Python's tempfile quietly falls back to /tmp when $TMPDIR is unusable; the
    # job would not, so neither does the check: the setting is named instead.
    where = os.environ.get("TMPDIR") or None
    if (why := unsafe_parent(where or tempfile.gettempdir())) is not None:
        raise error(why, "point TMPDIR at a directory of root's (or yours), or a sticky one such as /tmp")
    try:
        # Made under a name no sweep looks at, locked, and only then given a name of its own: a
        # directory named PREFIX... is locked from the moment it exists, so no sweep takes a live one.
        new = Path(tempfile.mkdtemp(prefix=NEW, dir=where))
    except OSError as e:
        raise error(*_unusable(where, e)) from None
    owner = -1
    try:
        owner = os.open(new / OWNER, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(owner, fcntl.LOCK_EX)
        made = _rename(new)
    except OSError as e:
        if owner >= 0:
            os.close(owner)
        shutil.rmtree(new, ignore_errors=True)
        raise error(*_unusable(where, e)) from None
    sweep(made.parent, keep=made)
    return made, owner


def _rename(new: Path) -> Path:
    """``new`` under a fresh random name of PREFIX's. Not one derived from ``new``'s, which every
    user sees: one of them could put a file there first and fail the launch."""
    for _ in range(8):
        made = new.with_name(PREFIX + secrets.token_hex(8))
        try:
            os.rename(new, made)
            return made
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise
    raise OSError(errno.EEXIST, "no free name for the workers' directory", str(new.parent))


def _unusable(where: str | None, e: OSError) -> tuple[str, str]:
    place = f"TMPDIR={where}" if where else "the temporary directory"
    return (f"{place} is not usable ({e.strerror or e}): the workers cannot write their results there, and the job's own temporary files would fail the same way",
            "point TMPDIR at a writable directory on a local disk with free space (or unset it)")


def unsafe_parent(where: str) -> str | None:
    """Why the workers' folder may not go in ``where``: another user could rename it, or a
    directory above it, away and put one of theirs, full of links, in its place (a sticky
    directory forbids that), or re-aim a link on the way."""
    if not os.path.exists(where):
        return None  # mkdtemp says what is wrong with it
    if why := pathtrust.steerable(where):
        return f"TMPDIR={where} could be replaced under the workers by another user: {why}"
    return None


def sweep(where: Path, keep: Path | None = None) -> list[str]:
    """Remove this user's private directories under ``where`` that no live run owns (a run
    killed before it could clean up); their names. Another user's are never touched, nor
    anything that is not a plain directory."""
    removed = []
    try:
        entries = list(os.scandir(where))
    except OSError:
        return removed
    for entry in entries:
        unnamed = entry.name.startswith(NEW)  # killed between its making and its lock: only once long dead
        if not (entry.name.startswith(PREFIX) or unnamed) or Path(entry.path) == keep:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or st.st_uid != os.geteuid():
                continue
            if (unnamed and time.time() - st.st_mtime < STALE_UNOWNED) or not _abandoned(entry.path, st):
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)  # fd-based on Linux: a link inside is removed, never followed
        removed.append(entry.name)
    return removed


def _abandoned(path: str, st: os.stat_result) -> bool:
    try:
        fd = os.open(os.path.join(path, OWNER), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return time.time() - st.st_mtime > STALE_UNOWNED
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False  # its run is alive
    finally:
        os.close(fd)
