"""`df` output, read into rows: what a person pastes to show /dev/shm's size.

GNU coreutils' df prints a header and one row per filesystem; the options
change the size columns, not their order (checked against coreutils 9.1):

  df, df -k     Filesystem     1K-blocks     Used Available Use% Mounted on
  df -B1        Filesystem     1B-blocks     Used Available Use% Mounted on
  df -BM        Filesystem     1M-blocks     Used Available Use% Mounted on   (values "24106M")
  df -BMB       Filesystem     1MB-blocks    Used Available Use% Mounted on   (values "25277MB")
  df -P         Filesystem     1024-blocks   Used Available Capacity Mounted on
  df -h, --si   Filesystem      Size  Used Avail Use% Mounted on             (values "64M", "1.0T")
  df -T         Filesystem     Type  1K-blocks ...                           (-hT: Type then Size)

busybox spells the human header "Size Used Available". -h counts in powers
of 1024 and rounds up ("16G" is more than 15 GiB, at most 16); --si prints
the same header in powers of 1000, told apart only by its lowercase "k". A
name longer than its column is printed alone with the numbers on the next,
indented line (older coreutils, busybox): the two are read as one row. A row
of `df -h | grep shm` without its header is read where its sizes carry a
unit; bare numbers without a header could be any block size and are not.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from preflight.base import tooltext

SHM_MOUNTS = ("/dev/shm", "/run/shm")  # /run/shm: older Debian/Ubuntu, where /dev/shm links to it

_HEADER = re.compile(
    r"^\s*Filesystem\s+(?P<type>Type\s+)?(?P<size>Size|\d+[KMGTPEZYk]?B?-blocks)\s+Used\s+Avail(?:able)?\s+"
    r"(?:Use%|Capacity)\s+Mounted on\s*$")
_VALUE = r"(?:\d+(?:[.,]\d+)?(?:[KMGTPEZYk]B?)?|-)"
# Type names start with a letter and sizes with a digit or "-", so the Type column is optional in one pattern.
_ROW = re.compile(
    r"^(?P<fs>\S+)\s+(?:(?P<type>[A-Za-z]\S*)\s+)?(?P<size>" + _VALUE + r")\s+(?P<used>" + _VALUE + r")\s+"
    r"(?P<avail>" + _VALUE + r")\s+(?P<pct>\d{1,3}%|-)\s+(?P<mnt>/.*?)\s*$")
_POWERS = "KMGTPEZY"


class Row(BaseModel):
    line: int  # 1-based; a wrapped row counts from its name's line
    filesystem: str  # the mount's source: "shm" (a container's), "tmpfs", "/dev/vda1"
    type: str | None  # from df -T; None where the layout has no Type column
    size_bytes: int | None  # None: "-" (no size)
    used_bytes: int | None
    avail_bytes: int | None
    use_percent: int | None
    mounted_on: str
    size_text: str  # as printed: "64M", "24683656"


class DfOutput(BaseModel):
    layout: str  # "human" (-h), "human-si" (--si), "1K-blocks", "1B-blocks", ..., "no header"
    block_bytes: int | None  # bytes per unit of a bare number; None for human sizes
    rows: list[Row]

    @property
    def human(self) -> bool:
        return self.block_bytes is None

    def shm(self) -> Row | None:
        """/dev/shm's row: the last one listed (a later mount hides an earlier one), else /run/shm's."""
        for mount in SHM_MOUNTS:
            rows = [r for r in self.rows if r.mounted_on == mount]
            if rows:
                return rows[-1]
        return None


def block_bytes(header: str) -> int:
    """Bytes per block of a "NK-blocks" header: 1K 1024, 1kB 1000, 1B 1, 1024 1024."""
    m = re.fullmatch(r"(\d+)([KMGTPEZYk]?)(B?)-blocks", header)
    if m is None:
        raise ValueError(header)
    n, power, si = int(m[1]), m[2].upper(), m[3]
    return n * ((1000 if si else 1024) ** (_POWERS.index(power) + 1) if power else 1)


def value_bytes(text: str, block: int | None, si: bool = False) -> int | None:
    """Bytes of one printed value: "64M", "1.0T", "1,5G" (a comma locale), "25MB" (-BMB: powers of 1000),
    or a count of ``block``."""
    if text == "-":
        return None
    if text.endswith("B"):
        text, si = text[:-1], True
    number, power = (text[:-1], text[-1].upper()) if text[-1].isalpha() else (text, "")
    base = 1000 if si else 1024
    scale = base ** (_POWERS.index(power) + 1) if power else (block or 1)
    value = float(number.replace(",", ".")) * scale
    return round(value) if value < 2**64 else None  # past any disk (or inf): no size df prints


def _header(lines: list[str]) -> tuple[int, re.Match[str]] | None:
    for i, line in enumerate(lines):
        if "Filesystem" in line and (m := _HEADER.match(line)):
            return i, m
    return None


def _joined(lines: list[str], start: int) -> list[tuple[int, str]]:
    """(line number, text) of each row, a name printed alone joined with the indented numbers after it."""
    out: list[tuple[int, str]] = []
    i = start
    while i < len(lines):
        line = lines[i].rstrip("\r")
        if len(line.split()) == 1 and not line[:1].isspace() and i + 1 < len(lines) and lines[i + 1][:1].isspace():
            out.append((i + 1, line.strip() + " " + lines[i + 1].strip()))
            i += 2
            continue
        out.append((i + 1, line))
        i += 1
    return out


def parse(text: str) -> DfOutput:
    """The rows of ``text``; a text with no header and no row with unit-bearing sizes has none. Never raises."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    lines = text.split("\n")
    head = _header(lines)
    if head is not None:
        at, m = head
        size = m["size"]
        block = None if size == "Size" else block_bytes(size)
        start = at + 1
    else:
        block, size, start = None, "no header", 0
    found = [(n, r) for n, line in _joined(lines, start) if (r := _ROW.match(line))]
    if head is None:  # bare numbers could be any block size: only rows whose size says its unit
        found = [(n, r) for n, r in found if r["size"][-1:].isalpha()]
    si = block is None and any(r[k].endswith("k") for _, r in found for k in ("size", "used", "avail"))
    layout = size if block is not None else ("human-si" if si else "human" if head is not None else "no header")
    rows = [Row(line=n, filesystem=r["fs"], type=r["type"], size_bytes=value_bytes(r["size"], block, si),
                used_bytes=value_bytes(r["used"], block, si), avail_bytes=value_bytes(r["avail"], block, si),
                use_percent=int(r["pct"][:-1]) if r["pct"] != "-" and len(r["pct"]) <= 5 else None, mounted_on=r["mnt"], size_text=r["size"])
            for n, r in found]
    return DfOutput(layout=layout, block_bytes=block, rows=rows)


def looks_like(text: str) -> bool:
    """Whether ``text`` is df output: its header in the first 200 lines, or a headerless
    /dev/shm row with unit-bearing sizes (`df -h | grep shm`)."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    lines = text.split("\n", 200)[:200]
    if _header(lines) is not None:
        return True
    return any((r := _ROW.match(line.rstrip("\r"))) and r["mnt"] in SHM_MOUNTS and r["size"][-1:].isalpha() for line in lines)
