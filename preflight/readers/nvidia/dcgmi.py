"""`dcgmi diag -r N` tables read into test results and DCGM's messages.

dcgmi draws a two-column box (NVIDIA/DCGM dcgmi/Diag.cpp): a test's row carries
its result (`Pass`, `Fail - GPU: 0`, `Pass - GPUs: 1, 2`, `Skip - All`; DCGM 4
prints `Fail` and then one `GPU0: Fail` row per GPU), and its messages follow as
`Warning`, `Error` or `Info` rows (DCGM 4: `Warning: GPU0`). A message is cut
every 45 characters, mid-word, onto rows with an empty name cell; so a message
continues exactly while its previous piece filled all 45, and the pieces are
joined back as they were cut, spaces and all.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from preflight.base import tooltext
from preflight.base.errors import UsageError

PIECE = 45  # DATA_INFO_TAG_LEN in dcgmi/Diag.cpp: a message's characters per row
Status = Literal["pass", "fail", "warn", "skip", "not run"]
_STATUS = r"(?P<status>Pass|Fail|Warn|Skip|Not Run)"
# "Fail - GPU: 0", "Pass - GPUs: 1, 2, 3", "Skip - All", or a bare "Pass" (deployment tests; DCGM 4's summary row)
_RESULT = re.compile(rf"^{_STATUS}(?:\s+-\s+(?:(?P<all>All)|GPUs?:\s*(?P<gpus>\d+(?:\s*,\s*\d+)*)))?$")
_ENTITY = re.compile(rf"^(?P<kind>GPU|CPU|Switch|Link|CpuCore)\s?(?P<id>\d+):\s+{_STATUS}$")  # DCGM 4: "GPU0: Fail"
_MESSAGE = re.compile(r"^(?P<kind>Warning|Error|Info)(?::\s*(?P<entity>[A-Za-z]+)\s?(?P<id>\d+))?$")  # DCGM 4: "Warning: GPU0"
_ROW = re.compile(r"^\s*\|(?P<name>[^|]*)\|(?P<cell>[^|]*)(?:\|\s*)?$")
_SECTION = re.compile(r"^\s*[|+]-+\s+(?P<name>[A-Za-z][A-Za-z ]*?)\s+-+\+-+[|+]\s*$")
_HEADER = re.compile(r"^\s*\|\s*Diagnostic\s*\|\s*Result\s*\|\s*$")
_FAILED_RUN = re.compile(r"^(?P<text>Error: (?:Unable to complete diagnostic|Diagnostic (?:can only|could not)).*)$")
_GPU_IN_TEXT = re.compile(r"\bGPU\s?(\d+)\b")


class DiagResult(BaseModel):
    category: str | None = None  # "Hardware"; None in a fragment cut above its section line
    test: str  # as printed: "GPU Memory", "memory", "Persistence Mode"
    status: Status
    gpu: int | None = None  # None: the test as a whole (DCGM 3's deployment tests, DCGM 4's summary row, "- All")
    all_gpus: bool = False  # "- All"


class DiagMessage(BaseModel):
    category: str | None = None
    test: str | None = None  # the test it is printed under
    kind: Literal["warning", "error", "info"]
    gpu: int | None = None  # from DCGM 4's "Warning: GPU0", else the first "GPU n" the text names
    text: str  # DCGM's words, joined back across the rows they were cut onto


class DcgmDiag(BaseModel):
    metadata: dict[str, str] = Field(default_factory=dict)  # "DCGM Version", "Driver Version Detected", ...
    results: list[DiagResult] = Field(default_factory=list)
    messages: list[DiagMessage] = Field(default_factory=list)


def looks_like(text: str) -> bool:
    """A dcgmi diag table, or a fragment of one: its header or a section line, a result
    row (`| GPU Memory | Fail - GPU: 0 |`) or a message row (`| Warning | ... |`)."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    for line in text.splitlines()[:200]:
        if _HEADER.match(line) or _SECTION.match(line) or _FAILED_RUN.match(line.strip()):
            return True
        row = _ROW.match(line)
        if row:
            name, cell = row["name"].strip(), row["cell"].strip()
            if (name and _RESULT.match(cell)) or _ENTITY.match(cell) or _MESSAGE.match(name):
                return True
    return False


def parse(text: str) -> DcgmDiag:
    """Raises UsageError where no row is a test's result or a DCGM message."""
    text = tooltext.clean(text)  # a capture with terminal escapes reads as the same capture without
    out = DcgmDiag()
    category: str | None = None
    test: str | None = None
    message: tuple[DiagMessage, list[str]] | None = None  # the message being joined, and its pieces
    for line in text.splitlines():
        section, row = _SECTION.match(line), _ROW.match(line)
        if section:
            category, test, message = section["name"], None, _close(out, message)
            continue
        if row is None or _HEADER.match(line):
            failed = _FAILED_RUN.match(line.strip())
            if failed:  # the whole run failed: dcgmi prints its one line and no table
                out.messages.append(DiagMessage(kind="error", text=failed["text"]))
            message = _close(out, message)
            continue
        name, raw = row["name"].strip(), row["cell"][1:] if row["cell"].startswith(" ") else row["cell"]
        cell = raw.strip()
        if not name and message and len(message[1][-1]) >= PIECE and not _ENTITY.match(cell):
            message[1].append(raw[:PIECE])
            continue
        message = _close(out, message)
        kind, entity = _MESSAGE.match(name), _ENTITY.match(cell)
        result = _RESULT.match(cell) if (name or test) and not kind else None
        if kind:
            gpu = int(kind["id"]) if kind["id"] and kind["entity"] == "GPU" else None
            message = (DiagMessage(category=category, test=test, kind=kind["kind"].lower(), gpu=gpu, text=""), [raw[:PIECE]])  # type: ignore[arg-type]
        elif entity and test:
            gpu = int(entity["id"]) if entity["kind"] == "GPU" else None
            out.results.append(DiagResult(category=category, test=test, status=_status(entity["status"]), gpu=gpu))
        elif result:
            test = name or test
            status = _status(result["status"])
            gpus = [int(g) for g in re.findall(r"\d+", result["gpus"] or "")]
            for gpu in gpus or [None]:
                out.results.append(DiagResult(category=category, test=test, status=status, gpu=gpu, all_gpus=bool(result["all"])))  # type: ignore[arg-type]
        elif name and cell and (category == "Metadata" or name in ("DCGM Version", "Driver Version Detected", "GPU Device IDs Detected")):
            out.metadata[name] = cell
    _close(out, message)
    if not out.results and not out.messages:
        raise UsageError("no dcgmi diag result in it (no `| Test | Pass/Fail ... |` row and no Warning or Error row); "
                         "save the whole `dcgmi diag -r N` output to a file and pass that")
    return out


def _close(out: DcgmDiag, message: tuple[DiagMessage, list[str]] | None) -> None:
    if message:
        m, pieces = message
        m.text = "".join(pieces).strip()
        if m.gpu is None and (named := _GPU_IN_TEXT.search(m.text)):
            m.gpu = int(named[1])
        if m.text:
            out.messages.append(m)
    return None


def _status(word: str) -> Status:
    return word.lower()  # type: ignore[return-value]
