"""Files written at a path a person gave, as root: never through a link another user planted.

preflight runs as root, and its report, textfile, page, calibrate's floors and
selftest's record go where a flag says, /tmp included. A symlink there is
followed only where no other user could have made it, the rule the kernel
applies in sticky world-writable directories (fs.protected_symlinks), made
stricter for root: the link is root's (or this user's) and sits in a directory
only root (or this user) can change, or a sticky one. Any other link in the
directory part of a path is refused; one at the end is replaced, never
followed, so what it points at is never touched.

Every step is taken relative to the directory reached before (``dir_fd``), so
nothing can be swapped in between the looking and the writing. A file is
written to a temporary name created exclusively (O_EXCL: no link, no other
user's file) in the destination's directory, synced, renamed over the name,
and the directory synced: a reader sees the old file or the new one, and a
full disk leaves the old one.
"""

from __future__ import annotations

import errno
import os
import pwd
import secrets
import stat
from collections import deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from preflight.base.errors import UsageError

MAX_STEPS = 40  # links followed and lookups retried: the kernel's own limit on links in one path
DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Untrusted(OSError):
    """A link another user could have made, in the directory part of a path."""

    def __init__(self, text: str, where: str):
        super().__init__(errno.EPERM, text, where)


def owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def replaceable(entry: os.stat_result, directory: os.stat_result) -> str | None:
    """Why another user could have put ``entry`` in ``directory`` or swap it
    (None: only root and this user could)."""
    mine = (0, os.geteuid())
    if directory.st_uid not in mine:
        return f"its directory is {owner(directory.st_uid)}'s"
    if directory.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not directory.st_mode & stat.S_ISVTX:
        return "other users can write its directory"
    if entry.st_uid not in mine:  # in a sticky directory, only an entry's owner may replace it
        return f"it is {owner(entry.st_uid)}'s"
    return None


@dataclass
class Place:
    """Where a path's last name lives: its directory (an O_PATH descriptor, held
    open) and the name in it, after the trusted links on the way."""

    dir_fd: int
    name: str
    directory: PurePosixPath  # for messages only
    st: os.stat_result | None  # the name itself, not followed; None: nothing there

    def __enter__(self) -> Place:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self.dir_fd)

    @property
    def planted(self) -> str | None:
        """Why the name, a link, was not followed (None: it is no such link)."""
        if self.st is None or not stat.S_ISLNK(self.st.st_mode):
            return None
        return replaceable(self.st, os.fstat(self.dir_fd)) or "preflight follows no link here"


def locate(path: Path | str, follow_last: bool = True) -> Place:
    """Walk ``path`` one name at a time. A link in the directory part is followed
    only if no other user could have made it (else Untrusted); the last name is
    followed under the same rule when ``follow_last``, and otherwise left as it is.
    Raises FileNotFoundError or NotADirectoryError for a directory part that is missing or
    not a directory (``filename`` names it)."""
    text = os.fspath(path)
    here = PurePosixPath("/" if text.startswith("/") else ".")
    fd = os.open(str(here), DIR_FLAGS)
    names = deque(n for n in text.split("/") if n not in ("", "."))
    steps = 0
    try:
        if not names:
            return Place(fd, ".", here, os.fstat(fd))
        while True:
            name = names.popleft()
            last = not names
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if last:
                    return Place(fd, name, here, None)
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(here / name)) from None
            if stat.S_ISLNK(st.st_mode) and (follow_last or not last):
                if why := replaceable(st, os.fstat(fd)):
                    if last:
                        return Place(fd, name, here, st)  # replaced by the writer, never followed
                    raise Untrusted(f"{here / name} is a symlink another user could have made ({why}); "
                                    "preflight follows no such link as root: give the real path", str(here / name))
                target = os.readlink(name, dir_fd=fd)
                steps += 1
                if steps > MAX_STEPS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), text)
                again = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if (again.st_ino, again.st_dev) != (st.st_ino, st.st_dev):
                    names.appendleft(name)  # swapped while read: look again
                    continue
                if target.startswith("/"):
                    os.close(fd)
                    fd, here = os.open("/", DIR_FLAGS), PurePosixPath("/")
                names.extendleft(reversed([n for n in target.split("/") if n not in ("", ".")]))
                continue
            if last:
                return Place(fd, name, here, st)
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(here / name))
            try:
                inner = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                steps += 1
                if e.errno not in (errno.ENOTDIR, errno.ENOENT, errno.ELOOP) or steps > MAX_STEPS:
                    raise
                names.appendleft(name)  # swapped between the look and the open: look again
                continue
            os.close(fd)
            fd, here = inner, here.parent if name == ".." else here / name
    except BaseException:
        os.close(fd)
        raise


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


def steerable(path: Path | str) -> str | None:
    """Why another user could change what ``path`` runs (it, or a directory on the way to
    it, is theirs or writable by others, or a link on the way is one they could re-aim), or
    None. For a program root runs, a file root reads its orders from, or a directory root
    works in: their owners decide what root does."""
    given, real = Path(os.path.abspath(path)), Path(os.path.realpath(path))
    # Both ways: a venv's bin/python is a link out of the venv, whose site-packages it imports.
    for p in dict.fromkeys([given, *given.parents, real, *real.parents]):
        try:
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                # A link's mode means nothing, but whoever could re-aim it (its owner, or one who may
                # replace it in its directory) decides what the path reaches from then on.
                if why := replaceable(st, os.stat(p.parent)):
                    return f"{p} is a symlink another user could re-aim ({why})"
                st = os.stat(p)
        except OSError:
            return None  # not there: running it says so
        if st.st_uid not in (0, os.geteuid()):
            return f"{p} is {owner(st.st_uid)}'s"
        # Group write by root's own group (gid 0, as /etc/preflight 0775 root:root) gives no one else a say.
        writers = stat.S_IWOTH | (stat.S_IWGRP if st.st_gid != 0 else 0)
        if st.st_mode & writers and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
            return f"{p} is writable by {'its group' if not st.st_mode & stat.S_IWOTH else 'every user'}"
    return None


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
