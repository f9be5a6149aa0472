"""/dev/shm as the node has it: the mount that holds it (/proc/self/mountinfo),
the largest files in it and their owners, and whether a segment in it can really be written.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from preflight.base.units import fmt_bytes

CHUNK = 1 << 20


@dataclass
class Mount:
    mount_point: str
    fstype: str
    source: str
    options: list[str]


def _unescape(s: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        s = s.replace(code, char)
    return s


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            continue
        options = fields[5].split(",") + (tail[2].split(",") if len(tail) > 2 else [])
        mounts.append(Mount(_unescape(fields[4]), tail[0], _unescape(tail[1]), options))
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds ``path``: the longest mount point above it, the
    last one listed where several stack on the same point."""
    best: Mount | None = None
    for m in mounts:
        mp = m.mount_point
        if mp == "/" or path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) >= len(best.mount_point):
                best = m
    return best


SCAN_MOST, SCAN_SECONDS = 10_000, 0.5  # any user can fill /dev/shm with millions of empty files


class ShmFile(NamedTuple):
    name: str  # printable: control characters escaped
    bytes: int  # the memory it holds (blocks, not its apparent size)
    uid: int | None = None  # its owner, where the file said


def largest_files(directory: Path, n: int = 3) -> list[ShmFile]:
    """The largest files among the first SCAN_MOST looked at within SCAN_SECONDS, with their owners:
    names for the cause of a full /dev/shm, never a listing that takes the quick level's whole budget."""
    files = []
    until = time.monotonic() + SCAN_SECONDS
    try:
        with os.scandir(directory) as entries:
            for i, entry in enumerate(entries):
                if i >= SCAN_MOST or time.monotonic() > until:
                    break
                try:
                    if entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        files.append(ShmFile(_printable(entry.name), st.st_blocks * 512, st.st_uid))
                except OSError:
                    continue
    except OSError:
        return []
    return sorted(files, key=lambda f: f.bytes, reverse=True)[:n]


def local_users(passwd: str) -> dict[int, str]:
    """uid -> name from /etc/passwd's text. Read as a file, not through NSS: a directory service
    (sssd, LDAP) that does not answer would hang the check on a name that only words its cause."""
    out: dict[int, str] = {}
    for line in passwd.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split(":")
        if len(fields) >= 2 and fields[1].isdigit():
            out.setdefault(int(fields[1]), _printable(name))
    return out


def _printable(name: str) -> str:
    """A file name any user chose, fit for a terminal: control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def touch_segment(directory: Path, size: int, deadline: float = math.inf) -> tuple[str | None, float]:
    """Create a segment of ``size`` bytes and write every page of it.

    fallocate first, so a tmpfs that cannot back the size answers ENOSPC here
    instead of SIGBUS on a page fault, as it would inside NCCL. The file is
    unlinked at once: the memory is freed when the fd closes, even if this
    process is killed mid-way, so no stale segment is ever left behind.
    """
    name = directory / f"preflight-shm-{os.getpid()}-{secrets.token_hex(4)}"
    start = time.monotonic()
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as e:
        return f"cannot create {name}: {e.strerror}", 0.0
    try:
        os.unlink(name)
        os.posix_fallocate(fd, 0, size)
        pattern = (b"preflight" * (CHUNK // 9 + 1))[:CHUNK]
        view = memoryview(pattern)  # slices of a memoryview do not copy
        for offset in range(0, size, CHUNK):
            if time.monotonic() > deadline:  # the runner gave up on us: stop writing into /dev/shm
                return f"stopped after {fmt_bytes(offset)}: out of time", time.monotonic() - start
            os.pwrite(fd, view[: min(CHUNK, size - offset)], offset)
        for offset in (0, size // 2, max(0, size - 9)):
            want = pattern[offset % CHUNK : offset % CHUNK + 9][: size - offset]
            if os.pread(fd, len(want), offset) != want:
                return f"data written at offset {offset} did not read back", time.monotonic() - start
        return None, time.monotonic() - start
    except OSError as e:
        return f"could not reserve and write {fmt_bytes(size)}: {e.strerror}", time.monotonic() - start
    finally:
        os.close(fd)
