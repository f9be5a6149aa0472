"""Reading this node's kernel log since boot: /dev/kmsg first, then journalctl, then dmesg,
each source's failure said (``KernelLog.unread``); a wrapped /dev/kmsg ring gets the journal's
older driver events (``KernelLog.note``). Finding the events in it is readers/kernel/xid.py.
"""

from __future__ import annotations

import errno
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from preflight.readers.kernel import journal
from preflight.readers.kernel.xid import DRIVER_MARK, parse

if TYPE_CHECKING:
    from preflight.base.host import Host


class KernelLogUnavailable(Exception):
    """No source of the kernel log could be read; ``cause`` says why, per source."""

    def __init__(self, cause: str, unread: dict[str, str] | None = None):
        super().__init__(cause)
        self.cause = cause
        self.unread = unread or {}  # each source, and why it gave nothing a reader could use


JOURNALCTL = journal.JOURNALCTL
DMESG = ("dmesg",)
SYSLOG_NOTE = ("dmesg read the kernel log through syslog(2) (this process cannot read /dev/kmsg), which loses where a "
               "message ends: the text after a newline inside a message reads as a line of its own")


def _read_kmsg(path: Path, deadline: float) -> str:
    # Non-blocking, so the end of the buffer is EAGAIN rather than a wait for
    # the next record. Each read() returns one whole record; EPIPE says the
    # kernel overwrote records we had not read yet, and the next read goes on
    # from the oldest one left.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 16384)  # larger than any record (8 KiB at most)
            except BlockingIOError:
                return b"".join(chunks).decode("utf-8", errors="replace")
            except BrokenPipeError:
                continue
            if not chunk:  # a regular file under a test root ends this way
                return b"".join(chunks).decode("utf-8", errors="replace")
            chunks.append(chunk)
    finally:
        os.close(fd)
    raise TimeoutError(errno.ETIMEDOUT, "the deadline passed before the end of the log")


def _has_lines(out: str) -> bool:
    return any(line.strip() and not line.startswith("-- ") for line in out.split("\n"))  # "-- No entries --"


def _text(out: str) -> bool:
    """Not a binary: no NUL. The kernel logs C strings, so no message holds one; other control
    characters a user put in a message (dmesg prints some raw) must not make the log unreadable."""
    return "\x00" not in out


class KernelLog(BaseModel):
    text: str
    source: str  # where it was read: /dev/kmsg, the command that printed it, or both joined by " + "
    unread: dict[str, str] = {}  # each source tried before, and why it gave nothing a reader could use
    note: str | None = None  # what this reading could not see, or how it was pieced together


def read_kernel_log(host: Host, timeout: float) -> tuple[str, str]:
    """(the kernel log since boot, where it came from), within ``timeout`` seconds."""
    log = read_log(host, timeout)
    return log.text, log.source


def _run(host: Host, argv: tuple[str, ...], timeout: float):
    # Looked up on the host's PATH only: a command the host does not have is not there, and
    # the agent's own PATH (a recorded node's replay, a test) must not answer for it.
    exe = shutil.which(argv[0], path=host.environ.get("PATH", os.defpath))
    if exe is None:
        raise FileNotFoundError(errno.ENOENT, f"{argv[0]} is not on PATH")
    return host.run([exe, *argv[1:]], timeout=timeout)


def _journal(host: Host, timeout: float, extra: tuple[str, ...] = (), mark: re.Pattern | None = None) -> tuple[str | None, str]:
    """The journal's kernel messages as dmesg lines (journal.lines), or None and why not;
    ``extra`` arguments for journalctl, ``mark`` as journal.lines takes it."""
    if timeout <= 0:
        return None, "no time left"
    deadline = time.monotonic() + timeout
    try:
        done = _run(host, (*JOURNALCTL, *extra), timeout)
    except OSError as e:
        return None, str(e.strerror or e)
    # journalctl without read access to the journal exits 0 and prints nothing of the
    # kernel's: an empty log is a failure to read, never a clean node. Nor is a text with no
    # message in it (garbage, a binary, another program's words).
    if done.timed_out:
        return None, "timed out"
    if done.returncode != 0:
        return None, (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    if not _has_lines(done.stdout):
        return None, (done.stderr.strip().splitlines() or ["printed nothing"])[-1]
    try:
        # Decoding gets a moment past the command's own deadline: journalctl may have used all of it.
        text = journal.lines(done.stdout, mark, deadline + DECODE_GRACE)
    except journal.CutShort as e:
        return None, str(e)
    if mark is not None and not text:
        return "", ""  # read, and no driver line in it
    return (text, "") if text else (None, "printed no kernel log line (garbage, or not a kernel log)")


DECODE_GRACE = 2.0  # seconds


def _booted(host: Host) -> float | None:
    """When this machine booted, seconds since the epoch (btime in /proc/stat)."""
    try:
        for line in host.read_text("/proc/stat").splitlines():
            if line.startswith("btime "):
                value = float(line.split()[1])
                return value if math.isfinite(value) and value > 0 else None
    except (OSError, ValueError, IndexError):
        pass
    return None


def _wrapped(host: Host, kmsg: str, source: str, deadline: float) -> KernelLog:
    """/dev/kmsg's text, with the journal's driver events older than the ring's first record
    where the ring has wrapped since boot (see readers/kernel/journal.py)."""
    first = journal.first_record(kmsg)
    if first is None or first[0] == 0:
        return KernelLog(text=kmsg, source=source)
    seq, usec = first
    lost = f"the kernel ring had wrapped since boot (its oldest record is #{seq}, {usec / 1e6:.0f} s after boot)"
    # Only what the ring lost, and only rows that name the driver: a node up for months keeps a
    # big journal, and this runs at every level.
    booted = _booted(host)
    older, why = _journal(host, deadline - time.monotonic(), journal.until(booted, usec) if booted else (), DRIVER_MARK)
    if older is None:
        # A note, not an unread source: most nodes keep no journal of the kernel (or no journalctl
        # in a container), and a ring that wrapped on a long-running node is no one's fault.
        return KernelLog(text=kmsg, source=source, note=(
            f"{lost} and the journal could not be read ({' '.join(JOURNALCTL)}: {why}): "
            "driver events older than that cannot be seen here"))
    events = journal.before(older, usec, lambda line: bool(DRIVER_MARK.search(line) and parse(line)))
    said = f"{lost}: the journal gave the {len(events)} driver line(s) older than it"
    if booted is not None:
        early, why = _journal(host, deadline - time.monotonic(), journal.until(booted, JOURNAL_FROM_BOOT * 1e6))
        if early is None and why in ("printed nothing", "-- No entries --"):
            # A journal vacuumed since boot (or one that never kept the kernel's first messages)
            # says nothing of what the ring lost before its own first entry.
            said += "; the journal itself holds no kernel message from around boot: driver events older than both cannot be seen here"
        elif early is None:
            said += f"; whether the journal reaches back to boot is unknown ({why})"
    return KernelLog(text="\n".join(events + [kmsg]), source=f"{source} + {' '.join(JOURNALCTL)}", note=said)


JOURNAL_FROM_BOOT = 0.0  # seconds after boot: journal.until's margin makes it the hours around boot


def read_log(host: Host, timeout: float) -> KernelLog:
    """The kernel log since boot from the first source that gives one, within ``timeout``
    seconds, with what each source tried before it could not give; KernelLogUnavailable
    naming every source where none can."""
    deadline = time.monotonic() + timeout
    kmsg = host.path("/dev/kmsg")
    kmsg_denied = True
    try:
        text = _read_kmsg(kmsg, deadline)
        if _has_lines(text):
            return _wrapped(host, text, str(kmsg), deadline)
        unread = {str(kmsg): "empty"}  # a sandbox's stand-in; a booted kernel has logged something
        kmsg_denied = False
    except OSError as e:
        unread = {str(kmsg): str(e.strerror or e)}
    # A command that hangs may take only half of what is left: the next source still has its turn.
    text, unread["journalctl"] = _journal(host, (deadline - time.monotonic()) / 2)
    if text is not None:
        del unread["journalctl"]
        return KernelLog(text=text, source=" ".join(JOURNALCTL), unread=unread)
    left = deadline - time.monotonic()
    name = DMESG[0]
    if left <= 0:
        unread[name] = "no time left"
        raise KernelLogUnavailable("; ".join(f"{where}: {why}" for where, why in unread.items()), unread)
    try:
        done = _run(host, DMESG, left)
    except OSError as e:
        unread[name] = str(e.strerror or e)
    else:
        # dmesg's own output is a kernel log whatever its lines look like: under printk.time=0
        # a line has no time stamp, and a log without a driver line has no mark either. Only
        # what no kernel prints (a binary) is refused.
        if done.returncode == 0 and not done.timed_out and _has_lines(done.stdout) and _text(done.stdout):
            return KernelLog(text=done.stdout, source=" ".join(DMESG), unread=unread,
                             note=SYSLOG_NOTE if kmsg_denied else None)
        if done.timed_out:
            unread[name] = "timed out"
        elif done.returncode != 0:
            unread[name] = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        elif not _has_lines(done.stdout):
            unread[name] = (done.stderr.strip().splitlines() or ["printed nothing"])[-1]
        else:
            unread[name] = "printed no kernel log line (garbage, or not a kernel log)"
    raise KernelLogUnavailable("; ".join(f"{where}: {why}" for where, why in unread.items()), unread)
