"""base/tooltext.py: what a terminal would show, and the environment tools run in."""

from pathlib import Path

import pytest

from preflight.base import tooltext

H200_TOPO = Path(__file__).parents[1] / "fixtures" / "node" / "h200-1x-vm" / "nvidia-smi-topo-m.txt"


def test_the_h200_header_loses_its_underline_and_keeps_its_tabs():
    raw = H200_TOPO.read_text()
    assert raw.startswith("\t\x1b[4mGPU0\tCPU Affinity")  # as driver 580 wrote it into a file
    assert tooltext.clean(raw).split("\n")[:2] == ["\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID", "GPU0\t X \t0-15\t0\t\tN/A"]


@pytest.mark.parametrize("raw, shown", [
    ("\x1b[1;31mFAIL\x1b[0m ok", "FAIL ok"),  # SGR with parameters
    ("\x1b[m\x1b[K\x1b[2J\x1b[?25lX\x1b[?25h", "X"),  # reset, erase, private modes
    ("\x1b]0;title\x07after", "after"),  # OSC ended by BEL
    ("\x1b]8;;https://x\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink ended by ST
    ("\x1b(B\x1b[m\x0fplain", "plain"),  # tput sgr0: charset, reset, shift-in
    ("\x1b=\x1b>\x1b7a\x1b8", "a"),  # keypad modes, save and restore the cursor
    ("ding\x07", "ding"),
    ("_\x08U_\x08n_\x08d", "Und"),  # man's underline overstrike
    ("B\x08Bold", "Bold"),
    ("\x08start", "start"),
    ("cut at the end\x1b", "cut at the end"),
    ("\x1b]unterminated title\nnext line", "\nnext line"),  # an open OSC never eats the next line
])
def test_control_sequences_go(raw, shown):
    assert tooltext.clean(raw) == shown


@pytest.mark.parametrize("text", [
    "[  12.345678] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n",
    "[Fri Aug 30 11:43:09 2024] x\n",
    "a [bracket] and \t tabs \t\tkept  and  spaces\n",
    "GPU0\t X \tNV18\t0-15\t0\t\tN/A\n",
    "",
    "ünïcödé \ufffd\n",
])
def test_plain_text_is_untouched(text):
    assert tooltext.clean(text) == text


def test_carriage_returns():
    assert tooltext.clean("a\r\nb\r\n") == "a\nb\n"
    assert tooltext.clean("10%\r50%\r100%\ndone\n") == "10% 50% 100%\ndone\n"  # a progress line: its writes in a row
    assert tooltext.clean("line\r\r\nnext\n") == "line\nnext\n"
    assert tooltext.clean("line\r\n\r\n") == "line\n\n"
    assert tooltext.clean("one\rtwo\rthree") == "one\rtwo\rthree"  # CR-separated lines, no LF anywhere


def test_a_lone_cr_is_content_never_a_rewrite_that_drops_the_lines_start():
    # Any user can get a CR into a kernel message (a refused mount option is logged as given):
    # the stamp and the message's own prefix must stay in front of what follows it.
    forged = "[ 12.345678] tmpfs: Unknown parameter 'y\rNVRM: Xid (PCI:0000:5d:00): 48, pid=0, DBE (0x1)'\n"
    assert tooltext.clean(forged) == forged.replace("\r", " ")
    assert tooltext.clean("a\rb\r") == "a\rb\r"  # no LF at all: CR-separated lines, kept


def test_clean_is_idempotent():
    raw = H200_TOPO.read_text() + "x\r\ny\rz\n\x1b[4m_\x08a\x1b[0m\n"
    once = tooltext.clean(raw)
    assert tooltext.clean(once) == once


def test_environment_fixes_locale_and_terminal_and_keeps_the_rest():
    env = tooltext.environment({"PATH": "/x/bin", "LD_LIBRARY_PATH": "/lib64", "LANG": "de_DE.UTF-8", "LC_NUMERIC": "de_DE",
                                "LANGUAGE": "de", "TERM": "xterm-256color", "COLUMNS": "40", "FORCE_COLOR": "1", "CUDA_HOME": "/c"})
    assert env["PATH"] == "/x/bin" and env["LD_LIBRARY_PATH"] == "/lib64" and env["CUDA_HOME"] == "/c"
    assert (env["LC_ALL"], env["LANG"], env["TERM"], env["NO_COLOR"]) == ("C", "C", "dumb", "1")
    assert not {"LC_NUMERIC", "LANGUAGE", "COLUMNS", "FORCE_COLOR"} & set(env)
