"""Reading a saved capture (a kernel log, an `nvidia-smi topo -m` output) that
a person hands over with ``--from FILE``: every problem is one UsageError line.

Nothing here can hang. A file is opened with O_NONBLOCK and judged by fstat of
what was opened (so a FIFO swapped in after a check cannot block the open), and
a pipe is read against a deadline: a FIFO nothing writes to is refused within
``WRITER_GRACE`` seconds, one whose writer never finishes within ``PIPE_SECONDS``.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import time
from pathlib import Path

from preflight.base import tooltext
from preflight.base.errors import UsageError

# A FIFO's writer may open it a moment after we do (`mkfifo f; preflight explain f & dmesg > f`);
# one that has not come by then is not coming. `<(cmd)` has its writer before preflight starts.
WRITER_GRACE = 2.0
# The most a pipe's writer may take in all: `<(ssh node dmesg)` takes seconds.
PIPE_SECONDS = 60.0


def open_nonblocking(path: Path | str) -> tuple[int, os.stat_result]:
    """``path`` opened for reading without blocking, and the fstat of what was opened.
    OSError as open() raises it; the caller closes the descriptor."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def read_regular(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file opened by ``open_nonblocking``."""
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(1 << 20, limit - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read_file(path: Path | str, limit: int) -> bytes | None:
    """At most ``limit`` bytes of the regular file at ``path``, opened without blocking; None where
    something else is there (a FIFO would hang the reader, a device never end). OSError as open
    or read raises it. For the small files a setting names (--nvml-fake, --hosts, nccl.conf)."""
    fd, st = open_nonblocking(path)
    try:
        return read_regular(fd, limit) if stat.S_ISREG(st.st_mode) else None
    finally:
        os.close(fd)


def read_text(path: Path | str, limit: int, too_big: str, option: str | None = "--from") -> str:
    """The file's text, read in at most ``limit`` bytes.

    A pipe is fine (``--from <(ssh node nvidia-smi topo -m)``) while something
    writes to it; a device is refused, since /dev/kmsg or /dev/zero would never
    end. ``too_big`` says what to pass instead of a file over the limit. Bytes
    that are not UTF-8 become U+FFFD: a log with one bad byte is still worth
    reading. ``option`` names the flag in messages; None for a positional argument.
    A document that quotes captures (a README) is refused: it is not one.
    """
    path = Path(path)
    label = f"{option} {path}" if option else str(path)
    try:
        fd, st = open_nonblocking(path)
    except FileNotFoundError:
        raise UsageError(f"{label}: no such file; check the path (a capture is the tool's output saved to a file)") from None
    except OSError as e:
        raise UsageError(_unreadable(label, e)) from None
    try:
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{label}: is a directory; give the file itself")
        if stat.S_ISREG(st.st_mode):
            data = read_regular(fd, limit + 1)
        elif stat.S_ISFIFO(st.st_mode):
            data = _read_pipe(fd, limit + 1, label)
        else:
            raise UsageError(f"{label}: is not a regular file; save the output to a file first")
    except OSError as e:
        raise UsageError(_unreadable(label, e)) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UsageError(f"{label}: larger than {_size(limit)}; {too_big}")
    # Windows PowerShell 5.1's `>` (Out-File's default "Unicode") saves UTF-16LE with its byte-order
    # mark: every other byte of it is NUL, yet it is text. Only a BOM says so; NUL bytes without one are binary.
    utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff")
    if not utf16 and b"\0" in data[:65536]:
        raise UsageError(f"{label}: is not text (a compressed or binary file?); decompress it first")
    # As a tool's output reaches a reader through Host.run: a capture saved with its terminal escapes
    # (driver 580's underlined topo -m header, a colourised log) reads as the same capture without.
    # utf-8-sig: a byte-order mark (Notepad, PowerShell 7's utf8BOM) would otherwise hide the first line's start.
    text = tooltext.clean(data.decode("utf-16" if utf16 else "utf-8-sig", errors="replace"))
    if utf16 and "\0" in text[:65536]:
        raise UsageError(f"{label}: is not text (a compressed or binary file?); decompress it first")
    if document(text):
        raise UsageError(f"{label}: is a document (Markdown) that quotes captures, not a capture; save the tool's own output to a file and pass that")
    return text


def _unreadable(label: str, e: OSError) -> str:
    """Why ``label`` could not be opened or read, and what to do about it."""
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"{label}: cannot be read ({e.strerror}); run as a user who may read it (root), or pass a copy you can read"
    if e.errno == errno.ENXIO:  # open() of a Unix socket
        return f"{label}: is a socket, not a file; save the output to a file first"
    return f"{label}: cannot be read ({e.strerror or e}); save the output to a file you can read and pass that"


def _read_pipe(fd: int, limit: int, label: str) -> bytes:
    """A pipe or FIFO read to its end. read() on a pipe with no writer returns b"" at once,
    so a FIFO nothing opened for writing is told from an empty one only by waiting a little."""
    started = time.monotonic()
    chunks, size, writer = [], 0, False
    while size < limit:
        left = started + PIPE_SECONDS - time.monotonic()
        if left <= 0:
            raise UsageError(f"{label}: its writer did not finish within {PIPE_SECONDS:g} s; save the output to a file first")
        try:
            chunk = os.read(fd, min(1 << 16, limit - size))
        except BlockingIOError:  # a writer is there, with nothing to say yet
            writer = True
            select.select([fd], [], [], min(left, 1.0))
            continue
        except OSError as e:
            if e.errno != errno.EINTR:
                raise
            continue
        if chunk:
            writer = True
            chunks.append(chunk)
            size += len(chunk)
        elif writer:
            break  # every writer closed it: the end
        elif time.monotonic() - started < WRITER_GRACE:
            time.sleep(0.05)
        else:
            raise UsageError(f"{label}: a FIFO nothing writes to; save the output to a file and pass that")
    return b"".join(chunks)


# What a document written for people has and a tool's output has not: Markdown headings set
# off by blank lines (nccl-tests' "# ..." header lines run together), code fences, links,
# and lines quoting code in backticks. One kind can be a pasted log's chance (a person's
# "```" around it); two kinds make a document.
_HEADING = re.compile(r"^#{1,6} +\S")
_FENCE = re.compile(r"^ {0,3}(?:```|~~~)")
_LINK = re.compile(r"\[[^\]\n]+\]\((?:https?://|#|\.{0,2}/)[^)\s]*\)")
_CODE = re.compile(r"`[^`\n]+`")


def document(text: str) -> bool:
    """Whether ``text`` is a Markdown document (a README, a design note) rather than a capture."""
    lines = text.split("\n")
    headings = sum(1 for i, line in enumerate(lines) if _HEADING.match(line) and (i == 0 or not lines[i - 1].strip())
                   and (i + 1 == len(lines) or not lines[i + 1].strip()))
    signs = [headings >= 2, sum(1 for line in lines if _FENCE.match(line)) >= 2,
             _LINK.search(text) is not None, sum(1 for line in lines if _CODE.search(line)) >= 3]
    return sum(signs) >= 2


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
