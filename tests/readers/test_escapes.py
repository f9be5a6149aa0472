"""Every reader's own entry point reads a capture decorated as terminals and tools decorate
it (colour, underline, erase-line, CR LF endings, a progress line's CRs) exactly as the
plain capture: the same bytes a program receives are accepted wherever a text enters."""

from pathlib import Path

import pytest

from preflight.readers.nvidia import dcgmi, nvsmi, topo
from preflight.readers import df
from preflight.readers.nccl import nccl_log, nccltests
from preflight.readers.machine import pcie
from preflight.readers.kernel import pcie_notice, xid

FIX = Path(__file__).parents[1] / "fixtures"


def decorated(text: str) -> str:
    """Each line coloured as `dmesg --color=always` or a logger colours it, ended CR LF."""
    out = []
    for i, line in enumerate(text.split("\n")):
        if line:
            line = f"\x1b[{31 + i % 6}m{line}\x1b[0m\x1b[K" if i % 2 else f"\x1b]0;t\x07\x1b[1m{line[:1]}\x1b[22m{line[1:]}"
        out.append(line)
    return "\r\n".join(out)


def _files(folder: str, pattern: str = "*") -> list[Path]:
    return sorted(p for p in (FIX / folder).glob(pattern) if p.is_file() and p.name not in ("SOURCE.md", "INDEX.md") and p.suffix != ".py")


def _dump(value: object) -> object:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    if isinstance(value, set):
        return sorted(value)
    return value


def _read(parse, text: str) -> object:
    try:
        return _dump(parse(text))
    except ValueError as e:
        return f"{type(e).__name__}: {e}"


CASES = ([(xid.parse, p) for p in _files("xid")] + [(nvsmi.parse, p) for p in _files("nvsmi", "q_*")]
         + [(dcgmi.parse, p) for p in _files("nvsmi", "dcgmi_*")] + [(df.parse, p) for p in _files("df")]
         + [(nccl_log.parse, p) for p in _files("nccl")] + [(nccltests.parse, p) for p in _files("nccltests")]
         + [(pcie_notice.parse, p) for p in _files("pcie_notice")] + [(pcie.parse_lspci, p) for p in _files("pcie/lspci")]
         + [(topo.parse, p) for p in _files("topo")])


@pytest.mark.parametrize("parse, path", CASES, ids=lambda c: c.name[:48] if isinstance(c, Path) else c.__module__.rsplit(".", 1)[-1])
def test_a_decorated_capture_reads_as_the_plain_one(parse, path):
    text = path.read_text()
    assert decorated(text) != text
    assert _read(parse, decorated(text)) == _read(parse, text)


@pytest.mark.parametrize("looks_like", [xid.looks_like, nvsmi.looks_like, dcgmi.looks_like, df.looks_like, nccl_log.looks_like,
                                        nccltests.looks_like, pcie_notice.looks_like, topo.looks_like], ids=lambda f: f.__module__)
def test_looks_like_sees_through_the_decoration(looks_like):
    for parse, path in CASES:
        text = path.read_text()
        assert looks_like(decorated(text)) == looks_like(text), path.name


def test_a_progress_line_reads_as_its_writes_in_a_row():
    plain = (FIX / "xid" / "01_xid63_row-remapper-new-row-marked_a100.txt").read_text()
    assert _read(xid.parse, "loading 10%\rloading 100%\r\n" + plain) == _read(xid.parse, "loading 10% loading 100%\n" + plain)
