"""Files written at a path a person gave, as root: never through a link another user planted.

Each path is reached as base/pathtrust.py walks it: a link followed only where
no other user could have made it. A file is
written to a temporary name created exclusively (O_EXCL: no link, no other
user's file) in the destination's directory, synced, renamed over the name,
and the directory synced: a reader sees the old file or the new one, and a
full disk leaves the old one. What a run reads back of its own past output
(``open_own``, ``read_own``) is only a file no other user could have written.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from preflight.base.errors import UsageError
from preflight.base.pathtrust import DIR_FLAGS, MAX_STEPS, Untrusted, locate, owner, replaceable


def create_temp(dir_fd: int, name: str, prefix: str = "") -> tuple[str, int]:
    """A new file of our own in the directory: a random name, created exclusively (never a link, never another's)."""
    for _ in range(MAX_STEPS):
        tmp = f".{prefix or name[:100]}.{secrets.token_hex(8)}.tmp"
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", name)


def _writable_dir(dir_fd: int) -> int:
    """The directory opened for fsync; the walk's O_PATH descriptor where it cannot be read (no fsync then)."""
    try:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    except PermissionError:
        return os.dup(dir_fd)


class Staged:
    """A file written whole beside its name, not yet in its place: ``commit`` renames it over
    the name (and fsyncs the directory), ``discard`` removes it. Either closes it."""

    def __init__(self, d: int, tmp: str, name: str):
        self._d, self._tmp, self._name = d, tmp, name

    def commit(self) -> None:
        try:
            os.replace(self._tmp, self._name, src_dir_fd=self._d, dst_dir_fd=self._d)
        except BaseException:
            self.discard()
            raise
        try:
            os.fsync(self._d)  # the rename itself survives a power cut
        except OSError as e:
            if e.errno != errno.EBADF:  # an O_PATH descriptor (a directory we may not read)
                raise
        finally:
            os.close(self._d)

    def discard(self) -> None:
        try:
            os.unlink(self._tmp, dir_fd=self._d)
        except FileNotFoundError:
            pass
        finally:
            os.close(self._d)


def stage(path: Path | str, data: bytes | str, mode: int = 0o644) -> Staged:
    """``data`` written (mode ``mode``, fsynced) to a temporary file of our own in ``path``'s
    directory, to be put in place later: a failure leaves the old file and no temporary one."""
    body = data.encode() if isinstance(data, str) else data
    with locate(path) as place:
        if place.st is not None and stat.S_ISDIR(place.st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        d = _writable_dir(place.dir_fd)
        name = place.name
    try:
        tmp, fd = create_temp(d, name)
    except BaseException:
        os.close(d)
        raise
    staged = Staged(d, tmp, name)
    try:
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)  # by descriptor: the umask does not choose it, and no name is followed
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        staged.discard()
        raise
    return staged


def write_atomic(path: Path | str, data: bytes | str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (mode ``mode``): a reader sees the old file or
    the new one, a failure leaves the old one and no temporary file. An untrusted
    link at ``path`` is itself replaced."""
    stage(path, data, mode).commit()


def remove(path: Path | str) -> None:
    """Unlink ``path``'s last name in its directory, reached as ``locate`` reaches it: never
    through a link another user could have made. Raises OSError (FileNotFoundError) as unlink."""
    p = Path(path)
    with locate(p.parent) as place:
        if why := place.planted:
            raise Untrusted(f"{p.parent} is a symlink another user could have made ({why})", str(p.parent))
        d = os.dup(place.dir_fd) if place.name == "." else os.open(place.name, DIR_FLAGS, dir_fd=place.dir_fd)
    try:
        os.unlink(p.name, dir_fd=d)
    finally:
        os.close(d)


class LinkAtName(Untrusted):
    """A link at the name itself that another user could have made: never followed to read."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path} is a symlink another user could have made ({why})", path)
        self.why = why


class NotRegular(OSError):
    """Something other than a regular file at the name (a directory, a FIFO, a device): not opened."""


def open_own(path: Path | str) -> tuple[int, str | None]:
    """The regular file at ``path`` opened for reading, reached as ``locate`` walks it, and why
    another user could have written it or put it there (None: only root or this user could).
    The caller closes the descriptor. Raises FileNotFoundError where nothing is there, NotRegular
    for anything else (never opened: a FIFO would hang the reader), LinkAtName or Untrusted for a
    link another user could have made, OSError as open raises it."""
    with locate(path) as place:
        if place.st is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fspath(path))
        if why := place.planted:
            raise LinkAtName(os.fspath(path), why)
        if not stat.S_ISREG(place.st.st_mode):
            raise NotRegular(errno.EINVAL, "not a regular file", os.fspath(path))
        fd = os.open(place.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=place.dir_fd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # swapped since it was looked at
                raise NotRegular(errno.EINVAL, "not a regular file", os.fspath(path))
            foreign = "other users can write it" if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) else replaceable(st, os.fstat(place.dir_fd))
        except BaseException:
            os.close(fd)
            raise
    return fd, foreign


def read_own(path: Path | str, limit: int = 64 << 20) -> bytes | None:
    """The file at ``path`` if no other user could have written it or put it
    there (root's or this user's, not writable by others, in a directory others
    cannot change); else None. For what a run reads back of its own past output."""
    try:
        fd, foreign = open_own(path)
    except OSError:
        return None
    try:
        if foreign:
            return None
        chunks, left = [], limit
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def make_dirs(path: Path | str, mode: int) -> None:
    """``path`` a directory: made where missing, with each missing directory above it, each
    ``mode`` exactly (not the umask's), in its parent as ``locate`` reaches it, so never
    through a link another user could have made. Raises Untrusted for such a link (at the
    name too), FileExistsError where something other than a directory holds a name, and
    OSError as mkdir raises it, ``filename`` the directory it could not make."""
    p = Path(path)
    try:
        place = locate(p)
    except FileNotFoundError:
        if p.parent == p:
            raise
        make_dirs(p.parent, mode)
        place = locate(p)
    with place:
        if why := place.planted:
            raise Untrusted(f"{p} is a symlink another user could have made ({why}); preflight follows no such link", str(p))
        if place.st is not None:
            if not stat.S_ISDIR(place.st.st_mode):
                raise FileExistsError(errno.EEXIST, "exists and is not a directory", str(p))
            return
        try:
            os.mkdir(place.name, mode, dir_fd=place.dir_fd)
        except FileExistsError:
            return  # made meanwhile by another run: what it is, the caller looks at
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(p)) from None
        fd = os.open(place.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=place.dir_fd)
        try:
            os.fchmod(fd, mode)  # by descriptor: the umask does not choose it
        finally:
            os.close(fd)


def check(path: Path, what: str, example: str = "report.json", fix: str | None = None) -> Path:
    """Refuse, before anything runs, a file path that could not be written: one
    line naming ``what`` (e.g. ``report PATH``) and the fix (``fix`` in place of
    each refusal's own, where given). Trying to create a file is the only honest
    test: root passes os.access() on a read-only mount."""
    parent = path.parent if str(path.parent) else Path(".")

    def refused(why: str, own: str) -> UsageError:
        return UsageError(f"{what}: {why}; {fix or own}")

    try:
        place = locate(path)
    except Untrusted as e:
        raise UsageError(f"{what}: {e.strerror}" + (f"; {fix}" if fix else "")) from None
    except FileNotFoundError:
        raise refused(f"directory {parent} does not exist", f"create it (mkdir -p {parent}) or choose another path") from None
    except NotADirectoryError as e:
        raise refused(f"{e.filename} is not a directory", "choose another path") from None
    except OSError as e:
        raise refused(f"cannot reach it ({e.strerror or e})", "choose another path") from None
    with place:
        st = place.st
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise refused("is a directory", f"give a file path such as {path / example}")
        if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            raise refused("is not a regular file (a device, pipe or socket would be replaced)", "give a file path")
        euid = os.geteuid()
        if st is not None and euid != 0 and st.st_uid != euid:
            dir_st = os.fstat(place.dir_fd)
            if dir_st.st_mode & stat.S_ISVTX and dir_st.st_uid != euid:
                raise refused(f"is {owner(st.st_uid)}'s, in a sticky directory where only they may replace it", "choose another path")
        try:
            tmp, fd = create_temp(place.dir_fd, "", prefix="preflight-probe")
            os.close(fd)
            os.unlink(tmp, dir_fd=place.dir_fd)
        except OSError as e:
            raise refused(f"cannot write in {place.directory} ({e.strerror or e})", "choose a writable directory") from None
    return path
