"""Whether another user could have steered a path: the judgement root's file access rests on.

preflight runs as root, and its report, textfile, page, calibrate's floors and
selftest's record go where a flag says, /tmp included. A symlink there is
followed only where no other user could have made it, the rule the kernel
applies in sticky world-writable directories (fs.protected_symlinks), made
stricter for root: the link is root's (or this user's) and sits in a directory
only root (or this user) can change, or a sticky one. Any other link in the
directory part of a path is refused; one at the end is left unfollowed
(``Place.planted`` says why), so safefile replaces it and what it points at
is never touched.

Every step is taken relative to the directory reached before (``dir_fd``), so
nothing can be swapped in between the looking and the writing (base/safefile.py
opens and writes there). ``steerable`` judges a whole path the same way, for a
program root runs, a file it reads its orders from, or a directory it works in.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

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

def steerable(path: Path | str) -> str | None:
    """Why another user could change what ``path`` runs (it, or a directory on the way to
    it, is theirs or writable by others, or a link on the way is one they could re-aim), or
    None. For a program root runs, a file root reads its orders from, or a directory root
    works in: their owners decide what root does."""
    given, real = Path(os.path.abspath(path)), Path(os.path.realpath(path))
    # Both ways: a venv's bin/python is a link out of the venv, whose site-packages it imports;
    # and every link on the way between, whose owner could re-aim it after this look.
    ends = list(dict.fromkeys([given, *given.parents, real, *real.parents]))
    between = [q for c in link_chain(given) for q in (c, *c.parents) if q not in ends]
    for p in dict.fromkeys([*ends, *between]):
        try:
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                # A link's mode means nothing, but whoever could re-aim it (its owner, or one who may
                # replace it in its directory) decides what the path reaches from then on.
                if why := replaceable(st, os.stat(p.parent)):
                    return f"{p} is a symlink another user could re-aim ({why})"
                st = os.stat(p)
        except OSError:
            if p in ends:
                return None  # not there: running it says so
            continue  # a step of the chain gone meanwhile: its ends are judged all the same
        if why := others_say(p, st):
            return why
    return None


def link_chain(path: Path) -> list[Path]:
    """``path`` and each path its last name's links lead to, one link at a time (at most MAX_STEPS),
    each made absolute from the real directory the link sits in (a ".." in a link is taken from
    there, as the kernel takes it, not from the way the link was reached)."""
    chain, p = [path], path
    for _ in range(MAX_STEPS):
        try:
            if not stat.S_ISLNK(os.lstat(p).st_mode):
                break
            p = Path(os.path.normpath(os.path.join(os.path.realpath(p.parent), os.readlink(p))))
        except OSError:
            break
        chain.append(p)
    return chain


def others_say(p: Path | str, st: os.stat_result) -> str | None:
    """Why another user has a say in the file or directory ``st`` is (theirs, or writable by
    others, by its mode or an ACL; a sticky directory's entries are its owners' alone), or None."""
    if st.st_uid not in (0, os.geteuid()):
        return f"{p} is {owner(st.st_uid)}'s"
    if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        return None
    # Group write by root's own group (gid 0, as /etc/preflight 0775 root:root) gives no one else a say.
    writers = stat.S_IWOTH | (stat.S_IWGRP if st.st_gid != 0 else 0)
    if st.st_mode & writers:
        return f"{p} is writable by {'its group' if not st.st_mode & stat.S_IWOTH else 'every user'}"
    return acl_writers(p)


_ACL_USER, _ACL_GROUP, _ACL_MASK = 0x02, 0x08, 0x10  # linux/posix_acl_xattr.h's tags
_ACL_WRITE = 0x02


def acl_writers(p: Path | str) -> str | None:
    """Why a POSIX ACL lets a named user or group write ``p`` (setfacl -m u:alice:rw), or None.
    Where an ACL has such entries the mode's group bits are its mask, so they say nothing of who
    is named: the entries themselves are read (system.posix_acl_access: a 4-byte header, then
    entries of tag, permissions and id)."""
    try:
        raw = os.getxattr(p, "system.posix_acl_access")
    except OSError:
        return None  # no ACL, or a filesystem without them: the mode said it all
    entries = [struct.unpack_from("<HHI", raw, at) for at in range(4, len(raw) - 7, 8)]
    mask = next((perm for tag, perm, _ in entries if tag == _ACL_MASK), 0o7)
    for tag, perm, ident in entries:
        if tag in (_ACL_USER, _ACL_GROUP) and perm & mask & _ACL_WRITE and not (tag == _ACL_USER and ident in (0, os.geteuid())) \
                and not (tag == _ACL_GROUP and ident == 0):
            who = f"user {owner(ident)}" if tag == _ACL_USER else f"group {ident}"
            return f"{p} is writable by {who} through an ACL"
    return None


def read_steerable(path: Path | str, opened: os.stat_result) -> str | None:
    """``steerable`` for a file already opened and read, ``opened`` its fstat: the file read
    must be one no other user has a say in, and ``path`` must still name it. Judging the path
    alone after the read would judge whatever is there now: a file another user put at the
    name and took away once it was read reads as nothing there, which steerable lets pass."""
    if why := others_say(path, opened):
        return why
    try:
        now = os.stat(path)
    except OSError:
        return f"{path} was removed or made unreadable while it was read"
    if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
        return f"{path} was replaced while it was read"
    return steerable(path)
