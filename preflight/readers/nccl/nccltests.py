"""Read the tables nccl-tests' *_perf binaries print: text in, `Table` out, for
`preflight explain` (outputs/explain/explain_nccltests.py), the fidelity benchmark
(tests/perf/bench_bandwidth.py) and the busbw arithmetic's tests.

Formats, from nccl-tests' sources (src/common.cu, later src/util.cu):
- a row: size (bytes), count (elements), type, redop and root, then per block
  (out of place, in place) time (us), algbw, busbw (GB/s = 1e9 bytes/s) and
  #wrong ("N/A" with -c 0). `-d all` / `-o all` change the type / redop within
  one table; -S 1 appends a timestamp; per-iteration timing adds four columns.
- older layouts: 2019-2022 "size count type redop" (broadcast: "root") with an
  "error" column, the largest relative error, not a count; 2017 "bytes N type
  op", time in ms and a "res" column.
- the header: "# nThread 1 nGpus 8 ... validation: 1", a line per rank,
  "#  Rank  0 Group  0 Pid 54740 on thanos device  0 [0x07] NVIDIA A100-SXM4-80GB"
  (no Group before 2022, no Pid before 2019, "[0000:07:00]" since 2025), and
  since 2025 "# Collective test starting: all_reduce_perf"; the footer
  "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 66.2058".
Launchers prefix lines ("[1,0]<stdout>:" mpirun --tag-output, " 0: " srun -l,
"[0] " mpiexec -l) and NCCL INFO lines interleave: each fact is found by its
own wording wherever it sits in a line. A run that fails prints NCCL WARN lines,
"Test NCCL failure common.cu:1005 '...'" or "Test failure common.cu:891", and the
launcher's exit notice; the known NCCL errors among them are nccl_errors' Problems.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel

from preflight.base import tooltext
from preflight.base.errors import UsageError
from preflight.readers.nccl import nccl_errors
from preflight.readers.nccl.nccl_errors import Problem

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoallv", "alltoall", "sendrecv", "gather", "scatter", "hypercube")
# nccl-tests' type names (test_typenames, old and new), so a stray "8 2 words" in a log is not a row.
_TYPE = r"(?:u?int(?:8|16|32|64)?|char|half|float(?:16|32|64)?|double|bfloat16|bf16|f8e4m3|f8e5m2|fp8\w*)"
_ROW = re.compile(rf"(?<![\w.:/-])(\d+)\s+(\d+)\s+({_TYPE})(?=\s|$)(.*)$")
_COLUMNS = re.compile(r"#\s*(size|bytes)\s+(count|N)\s+type\b(.*)$", re.M)  # re.M: looks_like searches the whole text
_RANK = re.compile(r"#\s+Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?(?:Pid\s+(\d+)\s+)?on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$")
_RUN = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+\d+\s+maxBytes\s+(\d+)(?:\s+step:\s*(\d+)\((factor|bytes)\))?(?:.*validation:\s*(\d+))?")
# nccl-tests' TESTCHECK/NCCLCHECK/CUDACHECK lines, and mpirun's, srun's and pdsh's notices of a rank that exited badly.
_FAILED = re.compile(r"\bTest (?:\w+ )?failure\b|\bnon-zero exit\b|[Ee]xit(?:ed)?(?: with)?(?: exit)? (?:code|status):? *[1-9]|exited on signal \d+")
# Real tables have under ~100 sizes per type; past this many rows a file is a log of many runs or junk,
# and a Row per line would cost seconds and gigabytes.
MAX_ROWS = 10_000
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d+)")
_VERSION = re.compile(r"nccl-tests version\s+(\S+)")
_BINARY = re.compile(r"\b(" + "|".join(COLLECTIVES) + r")_perf(?:_mpi)?\b")
_SETTING = re.compile(r"\b(NCCL_[A-Z0-9_]+)(?:\s*=\s*|\s+set by environment to\s+)([^\s\"']+)")
_STAMP = re.compile(r"\s+\d{4}-\d\d-\d\d\s+\d\d:\d\d:\d\d\s*$")  # -S 1: "%Y-%m-%d %H:%M:%S" after the row
_TYPE_WORD = re.compile(rf"[ \t]{_TYPE}[ \t]")
# The launcher's label of the process that printed a line: mpirun --tag-output, srun -l, mpiexec -l.
_LABEL = re.compile(r"\s*(?:\[\d+,(\d+)\]<std(?:out|err)>:|(\d+):(?=\s|$)|\[(\d+)\](?=\s))")


class Unreadable(UsageError, ValueError):
    """Text that is not an nccl-tests table, or one cut before any row: one line, exit 2.
    Also a ValueError, as this parser raised before `explain` existed."""


class Timing(BaseModel):
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None  # None: not validated (-c 0 prints N/A), or an older layout's error column
    error: float | None = None  # older layouts: the largest relative error, not a count


class Row(BaseModel):
    size: int
    count: int
    type: str
    redop: str | None = None  # None: a layout without the column (broadcast's, 2019-2022)
    root: int | None = None
    out_of_place: Timing
    in_place: Timing | None = None
    line: int = 0  # 1-based line number in the text


class Failure(BaseModel):
    """A line that shows the run failing."""

    what: str  # "test": nccl-tests' "Test ... failure"; "exit": the launcher's exit notice; "warn": an NCCL WARN
    line: int
    text: str


class Rank(BaseModel):
    rank: int
    host: str
    device: int
    bus_id: str  # "0x07" (before 2025) or "0000:07:00"
    gpu: str  # the CUDA device name: "NVIDIA A100-SXM4-80GB"
    pid: int | None = None


class Peak(BaseModel):
    busbw_gbps: float
    size: int
    column: str  # "out-of-place", "in-place", or "both" where they print the same figure
    type: str
    line: int


class Table(BaseModel):
    rows: list[Row]
    ranks: int | None  # rank lines, else inferred from busbw/algbw (ranks_from says which)
    ranks_from: str | None = None
    collective: str | None = None  # "all_reduce"
    collective_from: str | None = None
    rank_lines: list[Rank] = []
    hosts: list[str] = []  # distinct, in rank order
    nodes: int | None = None  # distinct hosts in the rank lines; None without them
    gpus: list[str] = []  # distinct GPU models in the rank lines
    ngpus: int | None = None  # per process: -g, times -t
    validation: bool | None = None  # the header's "validation: 0" is -c 0
    avg_busbw_gbps: float | None = None
    out_of_bounds: int | None = None
    settings: dict[str, str] = {}  # NCCL_* visible in the text (echoed, on a command line, or "set by environment")
    version: str | None = None  # nccl-tests' own, where printed
    layout: str = "size count type redop root"
    cut: list[int] = []  # lines that began a row but were cut or garbled: not read
    other_runs: list[int] = []  # lines where another run's table begins: not read
    max_bytes: int | None = None  # the header's -e: where a whole sweep ends
    step_factor: int | None = None  # -f (default 2) or -i: the header's "step: 2(factor)" / "step: 1048576(bytes)"
    step_bytes: int | None = None
    last_size: int | None = None  # the last row's size, read or not
    rows_not_read: int = 0  # rows past MAX_ROWS
    failed: list[Failure] = []  # the first line of each kind that shows the run failing
    problems: list[Problem] = []  # the known NCCL errors in the text (nccl_errors)

    @property
    def types(self) -> list[str]:
        return list(dict.fromkeys(r.type for r in self.rows))

    def peak(self, rows: list[Row] | None = None) -> Peak:
        """The highest busbw over both columns (of ``rows``, else the whole table)."""
        best: Peak | None = None
        for r in self.rows if rows is None else rows:
            o, i = r.out_of_place.busbw_gbps, r.in_place.busbw_gbps if r.in_place else -1.0
            value, column = (o, "both" if o == i else "out-of-place") if o >= i else (i, "in-place")
            if best is None or value > best.busbw_gbps:
                best = Peak(busbw_gbps=value, size=r.size, column=column, type=r.type, line=r.line)
        assert best is not None, "a Table always has rows"
        return best


class _Columns(BaseModel):
    """A column header line: what sits between type and the first time, and each block's width."""

    lead: list[str]  # ["redop", "root"], ["op"], ["root"]
    width: int  # 4, or 8 with per-iteration columns
    counts_wrong: bool  # "#wrong" (a count) rather than "error"/"res" (a relative error)
    ms: bool  # 2017's "bytes N" layout prints milliseconds
    line: int


def _columns(rest: str, first: str, number: int) -> _Columns:
    names = rest.split()
    times = [i for i, n in enumerate(names) if n in ("time", "cputime")]
    lead = names[: times[0]] if times else []
    width = (times[1] - times[0]) if len(times) > 1 else 4
    wrong = names[times[0] + 3] if times and len(names) > times[0] + 3 else "#wrong"
    return _Columns(lead=lead, width=width, counts_wrong=wrong == "#wrong", ms=first == "bytes", line=number)


def _number(tok: str) -> float:
    if not math.isfinite(value := float(tok)):
        raise ValueError(tok)
    return value


def _timing(block: list[str], cols: _Columns | None) -> Timing:
    time, algbw, busbw = (_number(t) for t in block[:3])
    tok, wrong, error = block[3], None, None
    if tok != "N/A":
        value = _number(tok)
        # Without a header, "0e+00"-style small figures are the old error column; a count is whole.
        if (cols.counts_wrong if cols else (value >= 1 or "e" not in tok.lower())) and value == int(value):
            wrong = int(value)
        else:
            error = value
    return Timing(time_us=time * 1000 if cols and cols.ms else time, algbw_gbps=algbw, busbw_gbps=busbw, wrong=wrong, error=error)


def _row(m: re.Match, cols: _Columns | None, number: int) -> Row | None:
    """The row, or None where it is cut short or garbled."""
    rest = _STAMP.sub("", m[4]).split()
    redop, root = None, None
    try:
        if cols is not None:
            lead, rest = rest[: len(cols.lead)], rest[len(cols.lead):]
            for name, tok in zip(cols.lead, lead):
                if name in ("redop", "op"):
                    redop = tok
                elif name == "root":
                    root = int(tok)
            width = cols.width
        else:
            if rest and re.fullmatch(r"[a-z]\w*", rest[0]):
                redop = rest.pop(0)
            if len(rest) % 4 == 1:
                root = int(rest.pop(0))
            width = 8 if len(rest) == 16 else 4
        if len(rest) not in (width, 2 * width):
            return None
        blocks = [_timing(rest[i : i + 4], cols) for i in range(0, len(rest), width)]
        size, count = int(m[1]), int(m[2])  # thousands of digits: int() refuses, and the row is garbled
    except (ValueError, IndexError):
        return None
    return Row(size=size, count=count, type=m[3], redop=redop, root=root, out_of_place=blocks[0],
               in_place=blocks[1] if len(blocks) > 1 else None, line=number)


def parse(text: str) -> Table:
    """Every fact of the first run's table in ``text``; Unreadable where there is no row."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    rows: list[Row] = []
    ranks: dict[int, Rank] = {}
    cols: _Columns | None = None
    facts: dict = {"settings": {}, "cut": [], "other_runs": [], "rows_not_read": 0}
    binaries: list[str] = []
    label = None  # the launcher's label of the process whose rows are read
    lines = text.split("\n")
    flagged, found = nccl_errors.flagged(text, lines), {}
    failed: dict[str, Failure] = {}
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if number - 1 in flagged:  # the cap bounds the patterns' work on a pathological line, as in nccl_log
            nccl_errors.record(found, line[:4096], number, flagged[number - 1])
        if "NCCL WARN" in line or (("ailure" in line or "xit" in line) and _FAILED.search(line)):
            what = "warn" if "NCCL WARN" in line else "exit" if "xit" in line and "ailure" not in line else "test"
            failed.setdefault(what, Failure(what=what, line=number, text=line.strip()[:500]))
        if "NCCL" in line:
            for m in _SETTING.finditer(line):
                facts["settings"].setdefault(m[1], m[2].removesuffix("."))  # NCCL ends "set by environment to 1."
            if "NCCL INFO" in line or "NCCL WARN" in line:
                continue
        if not rows and (m := _BINARY.search(line)):
            binaries.append(m[1])
        if m := _ROW.search(line):
            if "#" in line[: m.start()]:
                continue
            if len(rows) >= MAX_ROWS:  # only counted, whoever printed them: cheap, as a huge file needs
                facts["rows_not_read"] += 1
                facts["last_size"] = int(m[1])
                continue
            lm = _LABEL.match(line)
            who = next((g for g in lm.groups() if g is not None), None) if lm else None
            if rows and who != label:  # another process's run, printed beside the first (a build without MPI)
                facts["other_runs"] = facts["other_runs"] or [number]
                continue
            row = _row(m, cols, number)
            if row is None:
                facts["cut"].append(number)
            elif not facts["other_runs"]:
                rows.append(row)
                label, facts["last_size"] = who, row.size
            continue
        if m := _RANK.search(line):
            r = int(m[1])
            ranks.setdefault(r, Rank(rank=r, host=m[4], device=int(m[5]), bus_id=m[6], gpu=m[7], pid=int(m[3]) if m[3] else None))
        elif m := _COLUMNS.search(line):
            if rows:  # a second table header: another run follows
                facts["other_runs"] = facts["other_runs"] or [number]
            elif cols is None:
                cols = _columns(m[3], m[1], number)
        elif rows and facts["other_runs"]:
            continue
        elif m := _AVG.search(line):
            facts.setdefault("avg_busbw_gbps", float(m[1]))
        elif m := _OOB.search(line):
            facts.setdefault("out_of_bounds", int(m[1]))
        elif m := _RUN.search(line):
            if rows:
                facts["other_runs"] = facts["other_runs"] or [number]
            else:
                step = {m[5]: int(m[4])} if m[4] else {}
                facts.update(ngpus=int(m[1]) * int(m[2]), validation=None if m[6] is None else m[6] != "0", max_bytes=int(m[3]),
                             step_factor=step.get("factor"), step_bytes=step.get("bytes"))
        elif m := _VERSION.search(line):
            facts.setdefault("version", m[1])
    if not rows:
        if facts["cut"]:
            raise Unreadable(f"line {facts['cut'][0]}: an nccl-tests row with too few columns (size count type ... time algbw busbw #wrong): the output was cut; save the whole run")
        if cols is not None:
            raise Unreadable(f"line {cols.line}: an nccl-tests table header with no rows under it: the run stopped before its first size finished; save the whole run")
        raise Unreadable("no nccl-tests table rows found (size count type redop root time algbw busbw #wrong ...)")
    t = Table(rows=rows, ranks=None, rank_lines=sorted(ranks.values(), key=lambda r: r.rank), failed=sorted(failed.values(), key=lambda f: f.line),
              problems=nccl_errors.problems(found, len(ranks) or None), **facts)
    t.hosts = list(dict.fromkeys(r.host for r in t.rank_lines))
    t.gpus = list(dict.fromkeys(r.gpu for r in t.rank_lines if r.gpu))
    t.nodes = len(t.hosts) or None
    if cols is not None:
        t.layout = " ".join(["bytes N" if cols.ms else "size count", "type", *cols.lead]) + (" (#wrong)" if cols.counts_wrong else " (error)")
    if binaries:
        t.collective, t.collective_from = binaries[-1], f"the command or header ({binaries[-1]}_perf)"
    elif any(r.out_of_place.busbw_gbps > r.out_of_place.algbw_gbps * 1.01 for r in rows):
        t.collective, t.collective_from = "all_reduce", "inferred: busbw above algbw, which only all_reduce's factor 2(n-1)/n gives"
    if ranks:
        t.ranks, t.ranks_from = len(ranks), "the rank lines of the header"
    elif t.collective and (n := infer_ranks(t.collective, rows)):
        t.ranks, t.ranks_from = n, "inferred from busbw/algbw (nccl-tests' bus factor for the collective)"
    return t


def bus_factor(collective: str, n: int) -> float | None:
    """busbw / algbw in nccl-tests (each test's GetBw; doc/PERFORMANCE.md); None where it is 1 whatever n."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    return None


def infer_ranks(collective: str, rows: list[Row]) -> int | None:
    """The one rank count whose bus factor every printed busbw/algbw fits, within the
    rounding of the printed figures (2 decimals under 1000, then 1, then 0)."""
    if bus_factor(collective, 2) is None:
        return None
    fits = set(range(2, 4097))
    for r in rows:
        for t in (r.out_of_place, r.in_place):
            if t is None or t.algbw_gbps < 0.5:
                continue
            ha, hb = _half_unit(t.algbw_gbps), _half_unit(t.busbw_gbps)
            lo, hi = (t.busbw_gbps - hb) / (t.algbw_gbps + ha), (t.busbw_gbps + hb) / (t.algbw_gbps - ha)
            fits = {n for n in fits if lo <= bus_factor(collective, n) <= hi}  # type: ignore[operator]
    return fits.pop() if len(fits) == 1 else None


def _half_unit(v: float) -> float:
    return 0.005 if v < 999.995 else 0.05 if v < 9999.95 else 0.5


def looks_like(text: str) -> bool:
    """An nccl-tests table's column header, footer or a row, anywhere (with NCCL_DEBUG=INFO
    it may follow thousands of lines; rows are sought only around a type name, a fast scan).
    The rank header alone is not: NCCL logs of nccl-tests runs begin with it, and without a
    table they answer NCCL's questions (transports, errors), not a bandwidth one."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    if _COLUMNS.search(text) or _AVG.search(text):
        return True
    for m in _TYPE_WORD.finditer(text):
        end = text.find("\n", m.end())
        line = text[text.rfind("\n", 0, m.start()) + 1 : end if end >= 0 else None]
        row = _ROW.search(line) if "NCCL INFO" not in line and "NCCL WARN" not in line else None
        if row and "#" not in line[: row.start()] and re.match(r"\s+(?:[a-z]\w*\s+)?-?\d", row[4]):
            return True
    return False
