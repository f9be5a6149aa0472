"""How a line of `nvidia-smi topo -m` splits into cells, for readers/nvidia/topo.py.

nvidia-smi separates cells with tabs, but a capture reaches us through
terminals, tickets and user guides: tabs may be spaces, the header's names may
be joined by single spaces while the rows keep their tabs, and an affinity
cell nvidia-smi could not fill is printed empty (two tabs in a row) beside the
empty fields it pads with. These functions undo that and nothing more; what a
cell means is topo.py's business.
"""

from __future__ import annotations

import re

AFFINITY = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# The names a header holds, for a header whose names a paste joined with spaces: GPUn, NICn, the
# affinity columns, and RDMA device names as drivers print them (mlx5_0, rocep1s0f0, ibp24s0: lower
# case with a digit), so a fused "CPU AffinityNUMA Affinity" is never taken for names.
_NAMES = re.compile(r"(?:GPU\d+|NIC\d+|CPU Affinity|NUMA Affinity|GPU NUMA ID|[a-z][a-z0-9_.:-]*\d[a-z0-9_.:-]*)"
                    r"(?: +(?:GPU\d+|NIC\d+|CPU Affinity|NUMA Affinity|GPU NUMA ID|[a-z][a-z0-9_.:-]*\d[a-z0-9_.:-]*))*")
_NAME = re.compile(r"GPU\d+|NIC\d+|CPU Affinity|NUMA Affinity|GPU NUMA ID|[a-z][a-z0-9_.:-]*\d[a-z0-9_.:-]*")


def spaced_cells(line: str) -> list[str]:
    """A line whose tabs became spaces: the two- and three-word column names kept whole."""
    for i, name in enumerate(AFFINITY):
        line = line.replace(name, f"\0{i}")
    return [AFFINITY[int(c[1])] if c.startswith("\0") else c for c in line.split()]


def row_cells(line: str) -> list[str]:
    """A matrix row's cells; a row with tabs keeps its empty cells, which say where a value is missing."""
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    return spaced_cells(line)


def header_cells(line: str) -> list[str]:
    """The header's column names, without the empty cells around them. A tab-separated piece that
    is several known names joined by spaces is split into them; any other piece stays whole, so
    the error about a damaged header quotes it as it stands."""
    if "\t" not in line:
        return spaced_cells(line)
    out: list[str] = []
    for piece in (c.strip() for c in line.split("\t")):
        if " " in piece and _NAMES.fullmatch(piece):
            out += _NAME.findall(piece)
        else:
            out.append(piece)
    while out and out[0] == "":
        out.pop(0)
    while out and out[-1] == "":
        out.pop()
    return out


def affinity_values(tail: list[str], columns: list[str]) -> tuple[list[str | None], list[str]]:
    """The affinity cells of a GPU row (its cells after the links), one per column in ``columns``:
    the value as printed, "" where nvidia-smi printed nothing (unknown), None where the row ends
    first; and the non-empty cells left over, which no column takes.

    nvidia-smi pads with empty fields: one before GPU NUMA ID since driver ~545 ("0\\t\\tN/A"), and
    on some drivers one before every N/A ("0-7\\t\\tN/A\\t\\tN/A"). When the row holds a value for
    every column, the empty fields are all padding. Only when values are missing is each empty
    field weighed: padding before an N/A or a GPU NUMA ID, else a cell printed empty."""
    values = [c for c in tail if c != ""]
    if len(values) >= len(columns):
        return list(values[:len(columns)]), values[len(columns):]
    out: list[str | None] = []
    i = 0
    for column in columns:
        if i + 1 < len(tail) and tail[i] == "" and (tail[i + 1] == "N/A" or column == "GPU NUMA ID"):
            i += 1
        out.append(tail[i] if i < len(tail) else None)
        i += 1
    return out, [c for c in tail[i:] if c != ""]
