"""The kernel's messages as the systemd journal holds them, and where /dev/kmsg's ring
begins, for the Xid scan (readers/kernel/log_sources.py).

`journalctl -k -b -o json` prints one JSON object per message, its MESSAGE whole: a
newline a message holds stays inside it, where the short formats print the rest as
an indented line of its own, and a user's text after that newline ("tmpfs: Unknown
parameter 'y\\nNVRM: Xid ...'") would read as a line the driver printed. Each
entry becomes one dmesg-style line, "[ uptime] MESSAGE" with the message's line
breaks made spaces, so a message counts only where MESSAGE itself starts with the
driver's text. MESSAGE comes as an array of bytes where it is not valid UTF-8 or
holds control characters (systemd's JSON output, "binary" fields).

/dev/kmsg's records carry a sequence number that starts at 0 at boot: a first
record with a larger one says the ring has wrapped, and the messages before it
are gone from the ring (a flood of messages, which any user can cause, pushes an
old Xid out). The journal, where there is one, still holds them.
"""

from __future__ import annotations

import json
import re
import time

JOURNALCTL = ("journalctl", "-k", "-b", "--no-pager", "-o", "json")
_RECORD = re.compile(r"^\d+,(?P<seq>\d{1,20}),(?P<usec>\d{1,20}),[^;]*;")  # /dev/kmsg: prio,seq,usec,flags;text
_STAMP = re.compile(r"^\[\s*(?P<sec>\d{1,12}\.\d{6})\] ")
_BYTES = re.compile(r'"MESSAGE"\s*:\s*\[')  # MESSAGE as an array of bytes (journalctl spaces its JSON by version)
# Control characters a message may hold (the JSON gives its raw bytes): written as \xNN, as
# /dev/kmsg writes them, so none can act on the text around it (a backspace run would
# erase the line's time stamp and prefix before a user's "NVRM: Xid ..." in tooltext.clean).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _escaped(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _message(entry: object) -> str | None:
    if not isinstance(entry, dict):
        return None
    msg = entry.get("MESSAGE")
    if isinstance(msg, list) and all(isinstance(b, int) and 0 <= b < 256 for b in msg):
        msg = bytes(msg).decode("utf-8", errors="replace")
    return msg if isinstance(msg, str) else None


def _usec(entry: dict) -> int | None:
    # The kernel's own time of the message (journald copies it from /dev/kmsg); the time
    # journald received it, for a journal that lacks it, comes later and only orders.
    for key in ("_SOURCE_MONOTONIC_TIMESTAMP", "__MONOTONIC_TIMESTAMP"):
        value = entry.get(key)
        if isinstance(value, str) and value.isdigit() and len(value) <= 20:
            return int(value)
    return None


def lines(out: str, mark: re.Pattern | None = None, deadline: float | None = None) -> str | None:
    """journalctl's JSON output as dmesg lines, one per message; None where it holds no
    message (nothing, garbage, a binary, another format). With ``mark``, only rows whose
    raw text it finds are decoded, and rows whose MESSAGE comes as bytes (an Xid line names
    its process, whose name any user sets, control characters and all); past ``deadline``
    (time.monotonic) it raises CutShort: a partial log must never read as a whole one."""
    found = []
    for k, row in enumerate(out.split("\n")):
        if deadline is not None and k % 4096 == 0 and time.monotonic() > deadline:
            raise CutShort(f"the deadline came after {k} of its messages were read")
        row = row.strip()
        if not row.startswith("{") or (mark is not None and not mark.search(row) and not _BYTES.search(row)):
            continue
        try:
            entry = json.loads(row)
        except ValueError:
            continue
        msg = _message(entry)
        if msg is None:
            continue
        usec = _usec(entry)
        text = _escaped(" ".join(msg.splitlines())) if msg else ""  # every kind of line break: one message, one line
        if text[:1].isspace():
            text = "(indented)" + text  # a message that does not start with its text is not the driver's line
        found.append((f"[{usec // 1_000_000:5d}.{usec % 1_000_000:06d}] " if usec is not None else "") + text)
    return "\n".join(found) + "\n" if found else None


def until(booted: float, usec: int) -> tuple[str, ...]:
    """journalctl's arguments for the messages up to the ring's first record (``usec`` after
    a boot at ``booted``, seconds since the epoch), with MARGIN for the clock's steps since
    boot: the ring holds the rest, and ``before`` drops what it holds by the kernel's own time."""
    return ("--until", f"@{int(booted + usec / 1e6) + MARGIN}")


# Seconds: journald stamps what it reads of the kernel at start-up with the clock of that
# moment, which may run ahead by a UTC offset (an RTC kept in local time) until NTP sets it.
MARGIN = 15 * 3600


class CutShort(Exception):
    """The deadline came while the journal's output was being read: what was read is partial."""


def first_record(kmsg: str) -> tuple[int, int] | None:
    """(sequence number, microseconds since boot) of the first /dev/kmsg record read, or None."""
    m = _RECORD.match(kmsg)
    return (int(m["seq"]), int(m["usec"])) if m else None


def record_span(text: str) -> tuple[int, int] | None:
    """(first, last) sequence numbers of the /dev/kmsg records in ``text``, or None where it holds none."""
    seqs = [int(m["seq"]) for line in text.split("\n") if (m := _RECORD.match(line))]
    return (seqs[0], max(seqs)) if seqs else None


def before(journal: str, usec: int, keep) -> list[str]:
    """The journal's lines (from ``lines``) older than ``usec`` for which ``keep(line)`` holds:
    what the ring lost, each event once (the ring holds every message from ``usec`` on)."""
    out = []
    for line in journal.split("\n"):
        m = _STAMP.match(line)
        if m and round(float(m["sec"]) * 1e6) < usec and keep(line):
            out.append(line)
    return out
