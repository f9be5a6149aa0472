"""`nvidia-smi topo -m`: the parser (text in, model out) and CPU-list helpers.

The matrix is a tab-separated table whose layout drifted across drivers: the
header may lack its leading tab, old drivers have no NUMA column and call
SYS "SOC", drivers since ~545 add "GPU NUMA ID" and put an empty field before
it, NIC rows end with any number of empty fields, an affinity nvidia-smi could
not read is an empty cell. So columns are matched by header name, cells are
split as topo_cells says (padding told from a cell printed empty, which is
"unknown" and said in the notes), and anything that does not fit (a fused
cell, a mangled header, an asymmetric matrix) is a TopoParseError naming the
line: a wrong layout would give wrong pinning advice, which is worse than none.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, computed_field

from preflight.base import tooltext
from preflight.base.units import parse_cpulist
from preflight.readers.nvidia.topo_cells import AFFINITY, affinity_values, header_cells, row_cells

MAX_BYTES = 1 << 20  # an 8-GPU, 12-NIC matrix with its legends is 5 KiB
MAX_COLUMNS = 1024  # GPUs + NICs + affinity columns; real nodes have a few dozen
LINK = re.compile(r"^(X|NV[1-9][0-9]*|PIX|PXB|PHB|NODE|SYS|SOC)$")
# How far a GPU is from a NIC, nearest first. SOC is what old drivers call SYS.
DISTANCE = ["PIX", "PXB", "PHB", "NODE", "SYS", "SOC"]
NEAR = ("PIX", "PXB")  # no host bridge between them: GPUDirect RDMA at full speed
_GPU = re.compile(r"^GPU([0-9]+)$")
_NIC_LABEL = re.compile(r"^(?!GPU[0-9])[A-Za-z][A-Za-z0-9_.:-]*$")
_LEGEND = re.compile(r"^\s*(NIC[0-9]+)\s*:\s*(\S+)\s*$")
_HEADER = re.compile(r"^\s*GPU0(\s|$)")
_FIRST_ROW = re.compile(r"^GPU0[\t ]+X(\s|$)")
LOOKS_LINES = 200  # looks_like reads this many lines: a matrix sits near the top of what was pasted
# Driver 580+ underlines the header (ESC[4m ... ESC[0m) even into a pipe. A paste through a page
# that drops the ESC byte (GitHub issues: sglang's check_env output, tests/fixtures/topo/escapes-lost)
# leaves "[4mGPU0 ... GPU NUMA ID[0m"; on a header line, and only with both ends there, it is that underline.
_LOST_SGR = re.compile(r"^([\t ]*)\[[0-9;]{0,8}m(GPU0(?:\s[^\n]*?)?)\[[0-9;]{0,8}m([\t ]*)$", re.M)


def _readable(text: str) -> str:
    """``text`` as a terminal showed it: control sequences gone (tooltext.clean), and a header's
    underline whose ESC bytes a paste lost taken for the underline it was."""
    text = tooltext.clean(text)
    return _LOST_SGR.sub(r"\1\2\3", text) if "m" in text and "[" in text else text


class TopoParseError(ValueError):
    """The text is not a matrix this parser can vouch for; names the line."""

    def __init__(self, line: int | None, message: str):
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line


class TopoGpu(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    cpu_affinity: str | None = None  # as printed; None: no column or N/A
    cpus: list[int] | None = None
    numa_affinity: str | None = None
    numa_nodes: list[int] | None = None  # None: no NUMA column, or N/A
    gpu_numa_id: int | None = None  # a GPU that is its own NUMA node (Grace Hopper); N/A -> None
    nics: dict[str, str] = {}  # NIC name -> link type


class Topo(BaseModel):
    """One `nvidia-smi topo -m` matrix. GPU n is NVML's GPU n (both in PCI order)."""

    model_config = ConfigDict(frozen=True)

    gpus: list[TopoGpu]
    nics: list[str]  # real names (mlx5_0) where the legend or header gives them, else NICn
    links: dict[str, str]  # "0-1" -> "NV18", every GPU pair once, lower index first
    columns: list[str]  # the affinity columns this driver prints
    notes: list[str] = []  # tolerated oddities: truncation, no legend

    def link(self, a: int, b: int) -> str:
        return self.links[f"{min(a, b)}-{max(a, b)}"]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def numa_nodes(self) -> list[int] | None:
        """The NUMA nodes the GPUs sit on; None when the matrix does not say."""
        if any(g.numa_nodes is None for g in self.gpus) or not self.gpus:
            return None
        return sorted({n for g in self.gpus for n in g.numa_nodes or []})

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cpu_groups(self) -> list[str]:
        """The distinct CPU affinities of the GPUs: two means two sockets even without a NUMA column."""
        return sorted({g.cpu_affinity for g in self.gpus if g.cpu_affinity}, key=lambda s: parse_cpulist(s)[0])

    @computed_field  # type: ignore[prop-decorator]
    @property
    def spans_numa(self) -> bool | None:
        """True when the GPUs sit on more than one NUMA node (or, with no NUMA
        column, on disjoint CPU sets); None when the matrix cannot tell."""
        if self.numa_nodes is not None:
            # A GPU affine to several nodes ("0-1") shares them: split only when no node is common to all.
            return not set.intersection(*(set(g.numa_nodes or []) for g in self.gpus))
        cpus = [set(g.cpus) for g in self.gpus if g.cpus]
        if not cpus or len(cpus) < len(self.gpus):
            return None
        return any(not (a & b) for a in cpus for b in cpus)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def nearest_nics(self) -> dict[str, list[str]]:
        """GPU index -> the NICs at its smallest distance (several on a shared switch)."""
        out = {}
        for g in self.gpus:
            if g.nics:
                best = min(DISTANCE.index(t) for t in g.nics.values())
                out[str(g.index)] = [n for n, t in g.nics.items() if DISTANCE.index(t) == best]
        return out


# ---- parsing ---------------------------------------------------------------


def looks_like(text: str) -> bool:
    """Whether ``text`` holds a `nvidia-smi topo -m` matrix, damaged or not: a header line that
    starts with GPU0 and, next, the GPU0 row with X on its diagonal."""
    text = _readable(text)  # a capture with terminal escapes reads as the same capture without
    lines = text.split("\n", LOOKS_LINES)[:LOOKS_LINES]
    for i, line in enumerate(lines[:-1]):
        if _HEADER.match(line) and _FIRST_ROW.match(lines[i + 1]):
            return True
    return False


def _header(lines: list[str]) -> tuple[int, list[str]]:
    for i, line in enumerate(lines):
        if _HEADER.match(line):
            return i, header_cells(line)
    raise TopoParseError(None, "no header line starting with GPU0: this is not the output of `nvidia-smi topo -m`")


def _split_header(cells: list[str], line: int) -> tuple[int, list[str], list[str]]:
    """(GPU count, NIC labels, affinity columns), checking the order."""
    gpus = 0
    while gpus < len(cells) and _GPU.match(cells[gpus]):
        if cells[gpus] != f"GPU{gpus}":
            raise TopoParseError(line, f"header has {cells[gpus]} where GPU{gpus} belongs; the header is damaged")
        gpus += 1
    rest = cells[gpus:]
    if len(cells) > MAX_COLUMNS:
        raise TopoParseError(line, f"header has {len(cells)} columns; nvidia-smi prints one per GPU and NIC, never this many")
    nics: list[str] = []
    seen: set[str] = set()
    while rest and rest[0] not in AFFINITY:
        label = rest.pop(0)
        if not _NIC_LABEL.match(label) or label in seen:
            raise TopoParseError(line, f"header column {label!r} is neither a GPU, a NIC nor an affinity column; the header is damaged")
        nics.append(label)
        seen.add(label)
    for label in rest:
        if label not in AFFINITY or rest.count(label) > 1:
            raise TopoParseError(line, f"header column {label!r} after the affinity columns; the header is damaged")
    return gpus, nics, rest


def _affinity(values: list[str], columns: list[str], line: int) -> dict[str, object]:
    got = dict(zip(columns, values))
    out: dict[str, object] = {}
    try:
        if (cpu := got.get("CPU Affinity")) not in (None, "N/A", ""):
            out.update(cpu_affinity=cpu, cpus=parse_cpulist(cpu))
        if (numa := got.get("NUMA Affinity")) not in (None, "N/A", ""):
            out.update(numa_affinity=numa, numa_nodes=parse_cpulist(numa))
        if (gid := got.get("GPU NUMA ID")) not in (None, "N/A", ""):
            if not gid.isdigit():
                raise ValueError(f"{gid!r} is not a NUMA node number")
            out["gpu_numa_id"] = int(gid)
    except ValueError as e:
        raise TopoParseError(line, f"affinity value {e}") from None
    return out


def _gpu_affinity(tail: list[str], columns: list[str], row: str, lineno: int, last_line: bool, cut: bool,
                  notes: list[str]) -> list[str]:
    """The affinity values of GPU row ``row`` ("" for a cell printed empty), as many as are sure:
    on the text's last line the value it ends in may be cut short, so it is left out, with a note."""
    values, left = affinity_values(tail, columns)
    read = [v for v in values if v is not None]  # None only after the row's last cell
    if left or (len(read) < len(columns) and not last_line):
        given = len([c for c in tail if c != ""])
        raise TopoParseError(lineno, f"row {row} has {given} affinity values for {len(columns)} affinity columns "
                             f"({', '.join(columns) or 'none'}); rows and header disagree")
    if last_line and read and (cut or len(read) < len(columns)):
        read = read[:-1]  # the value the text ends in may be cut short: unknown, not wrong
    if len(read) < len(columns):
        notes.append(f"the capture ends inside row {row}: {', '.join(columns[len(read):])} unknown")
    return read


def parse(text: str) -> Topo:
    """The matrix in ``text``; raises TopoParseError on anything it cannot vouch for."""
    text = _readable(text)  # a capture with terminal escapes reads as the same capture without
    if not text.strip():
        raise TopoParseError(None, "the text is empty: no `nvidia-smi topo -m` matrix in it")
    if "\0" in text:
        raise TopoParseError(None, "the text holds NUL bytes: it is binary, not `nvidia-smi topo -m` output")
    lines = text.splitlines()
    # Without a final newline the last line may be cut mid-value ("0-2" of "0-23").
    cut = not text.endswith(("\n", "\r"))
    start, header = _header(lines)
    n_gpu, nic_labels, columns = _split_header(header, start + 1)
    if n_gpu == 0:
        raise TopoParseError(start + 1, "header names no GPU column")
    labels = [f"GPU{i}" for i in range(n_gpu)] + nic_labels
    width = len(labels)
    matrix: dict[str, list[str]] = {}
    gpus: list[TopoGpu] = []
    notes: list[str] = []
    empty: dict[str, list[int]] = {}  # affinity column -> GPUs whose cell nvidia-smi printed empty
    rows = lines[start + 1:]
    end = len(rows)
    for offset, raw in enumerate(rows):
        lineno = start + 2 + offset
        if not raw.strip() or raw.strip().startswith("Legend"):
            end = offset
            break
        expected = labels[len(matrix)] if len(matrix) < width else None
        cells = row_cells(raw)
        if expected is None:
            raise TopoParseError(lineno, f"row {cells[0]!r} after the last row the header announces ({labels[-1]})")
        if cells[0] != expected:
            raise TopoParseError(lineno, f"row {cells[0]!r} where the header says {expected} comes next; rows and header disagree")
        link_cells = cells[1:1 + width]
        last_line = offset == len(rows) - 1
        row = len(matrix)
        bad = [(label, cell) for i, (label, cell) in enumerate(zip(labels, link_cells)) if not _link_ok(cell, row, i, row < n_gpu and i < n_gpu)]
        if last_line and not expected.startswith("GPU") and (len(link_cells) < width or bad):
            # NIC-to-NIC links only: a cut last NIC row costs nothing the judges use.
            notes.append(f"the capture ends inside row {expected} (line {lineno}): NIC-to-NIC links from there on unknown")
            end = offset
            break
        if len(link_cells) < width:
            raise TopoParseError(lineno, f"row {expected} has {len(link_cells)} link cells, the header {width}: "
                                 + ("the capture is cut off inside the GPU rows" if last_line else "a cell is missing or two are fused"))
        if bad:
            label, cell = bad[0]
            raise TopoParseError(lineno, f"row {expected}, column {label}: {cell!r} is not a link type that belongs there "
                                 "(X on the diagonal only; NV# between GPUs; PIX, PXB, PHB, NODE, SYS, SOC); cells fused or split")
        matrix[expected] = link_cells
        if expected.startswith("GPU"):
            read = _gpu_affinity(cells[1 + width:], columns, expected, lineno, last_line, cut, notes)
            for column, value in zip(columns, read):
                if value == "":
                    empty.setdefault(column, []).append(len(gpus))
            nics = dict(zip(nic_labels, link_cells[n_gpu:]))
            gpus.append(TopoGpu(index=len(gpus), nics=nics, **_affinity(read, columns, lineno)))  # type: ignore[arg-type]
        elif extra := [c for c in cells[1 + width:] if c != ""]:
            raise TopoParseError(lineno, f"NIC row {expected} carries values after its links: {extra[0]!r}")
    if len(gpus) < n_gpu:
        raise TopoParseError(start + 2 + len(matrix), f"{len(gpus)} GPU rows for {n_gpu} GPU columns: the capture is cut off inside the GPU rows")
    notes[:0] = [f"{column} printed empty for GPU {', '.join(map(str, which))}: unknown for {'it' if len(which) == 1 else 'them'}"
                 for column, which in empty.items()]  # first: they are about GPUs, the cut-off notes about NICs
    if len(matrix) < width:
        notes.append(f"no rows for {', '.join(labels[len(matrix):])}: the capture was cut off; GPU facts are complete")
    _check_symmetry(matrix, labels, start)
    tail = lines[start + 1 + end:]
    for i, line in enumerate(tail):
        if _HEADER.match(line):
            raise TopoParseError(start + 2 + end + i, "a second matrix header: the file holds more than one capture; pass one")
    names = _nic_names(tail[:-1] if cut and tail else tail, nic_labels, notes)
    gpus = [g.model_copy(update={"nics": {names[k]: v for k, v in g.nics.items()}}) for g in gpus]
    links = {f"{a}-{b}": matrix[f"GPU{a}"][b] for a in range(n_gpu) for b in range(a + 1, n_gpu)}
    return Topo(gpus=gpus, nics=[names[k] for k in nic_labels], links=links, columns=columns, notes=notes)


def _link_ok(cell: str, row: int, col: int, gpu_pair: bool) -> bool:
    if not LINK.match(cell):
        return False
    if (cell == "X") != (row == col):
        return False
    return gpu_pair or not cell.startswith("NV")  # NVLink joins GPUs, never a NIC


def _check_symmetry(matrix: dict[str, list[str]], labels: list[str], start: int) -> None:
    for i, a in enumerate(labels):
        for j, b in enumerate(labels):
            if a not in matrix or b not in matrix:
                continue
            here, there = matrix[a][j], matrix[b][i]
            if here != there:
                raise TopoParseError(start + 2 + max(i, j), f"{a}->{b} is {here} but {b}->{a} is {there}; the matrix is damaged")


def _nic_names(lines: list[str], labels: list[str], notes: list[str]) -> dict[str, str]:
    """NICn -> the device name the NIC Legend gives; real names stay as they are."""
    legend: dict[str, str] = {}
    in_legend = False
    for line in lines:  # the lines after the matrix
        if line.strip().startswith("NIC Legend"):
            in_legend = True
        elif in_legend and (m := _LEGEND.match(line)):
            legend[m[1]] = m[2]
    names = {}
    for label in labels:
        if re.fullmatch(r"NIC[0-9]+", label):
            names[label] = legend.get(label, label)
        else:
            names[label] = label
    unnamed = [label for label in labels if names[label] == label and label.startswith("NIC")]
    if unnamed:
        notes.append(f"no NIC Legend entry for {', '.join(unnamed)}: device names unknown")
    if len(set(names.values())) < len(names):
        raise TopoParseError(None, "the NIC Legend gives two NICs the same name; the legend is damaged")
    return names
