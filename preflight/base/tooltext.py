"""Tool output as a reader should see it: what a terminal would show, without
the control sequences that make it show so; and the environment tools run in.

Tools decorate their output whether or not a terminal reads it: driver 580's
`nvidia-smi topo -m` wraps its header in ESC[4m ... ESC[0m even into a pipe,
systemd colours by $TERM and $SYSTEMD_COLORS, progress lines rewrite
themselves with CR (a CR inside a text that has line feeds is read as a space:
kernel messages can carry one a user put there), man-style pagers overstrike with backspaces. A reader
matches words and columns; these bytes would split a column name ("\\x1b[4mGPU0")
or hide a line. So every tool's output (base/host.py) and every saved capture
(readers/capture.py), and each parser at its own door, goes through ``clean``
first: a capture with the escapes reads exactly as the same capture without.

Only control sequences go: a "[" in a log line, tabs and the spaces that hold
columns stay. Standard library only, pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# ECMA-48: CSI is ESC [ then parameter bytes 0x30-0x3F, intermediates 0x20-0x2F, one
# final byte 0x40-0x7E. OSC, DCS, SOS, PM and APC carry a string up to ST (ESC \) or,
# in xterm's use, BEL; one left open ends at the line's end, never eating the next line.
# Any other escape is ESC, intermediates, one final byte (ESC ( B, ESC =, ESC 7).
_ESCAPE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]"
    r"|[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)?"
    r"|[ -/]*[0-~]"
    r"|)"  # a lone ESC (a sequence cut off at the end of the text)
)
# BEL; SO and SI, the charset shifts some terminals' reset (sgr0) emits.
_STRAY = str.maketrans("", "", "\x07\x0e\x0f")
_OVERSTRIKE = re.compile(r"[^\x08\n]\x08")  # "_\bX" underlines X, "X\bX" bolds it: X is what shows
_CR_LF = re.compile(r"\r+\n")  # "\r\r\n" too: a CR before a line feed moves the cursor and writes nothing
_SIGNS = "\x1b\x07\x08\x0e\x0f\r"


def clean(text: str) -> str:
    """``text`` as a terminal would show it, without control sequences; idempotent.

    CR LF ends a line as LF does. A lone CR inside a text that has line feeds
    is content, a space: a terminal would let what follows it overwrite the
    line's start, but any user can get a CR into a kernel message (a mount
    option a filesystem refuses is logged as given), and "what was written
    last" would then drop the timestamp and the message's own prefix and leave
    the user's forged driver line. A progress line so reads as all its writes
    in a row, which no reader mistakes for anything. A text with CRs and no LF
    at all keeps them: it is CR-separated lines (old Mac files).
    """
    if not any(sign in text for sign in _SIGNS):
        return text  # the common case: a tool that printed plain text (a memchr per sign, no regex)
    if "\x1b" in text:
        text = _ESCAPE.sub("", text)
    if any(stray in text for stray in "\x07\x0e\x0f"):
        text = text.translate(_STRAY)
    while "\x08" in text:
        cleaned = _OVERSTRIKE.sub("", text)
        if cleaned == text:
            text = text.replace("\x08", "")  # a backspace with nothing before it on its line
            break
        text = cleaned
    if "\r" in text:
        text = _CR_LF.sub("\n", text)
        if "\r" in text and "\n" in text:
            text = text.replace("\r", " ")
    return text


# The agent's terminal is not the tool's: these describe a screen the tool's pipe does not have.
_TERMINAL = ("COLUMNS", "LINES", "COLORTERM", "CLICOLOR_FORCE", "FORCE_COLOR")


def environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment a tool runs in: ``base`` (PATH, LD_LIBRARY_PATH, what the tool
    needs) with the locale fixed to C, so numbers ("1,5" for 1.5) and words ("inaktiv")
    do not change with the operator's, and no terminal: TERM=dumb, NO_COLOR, systemd's
    colours and pager off. Python children under LC_ALL=C still read and write UTF-8
    (PEP 538, PEP 540)."""
    env = {k: v for k, v in base.items() if not k.startswith("LC_") and k not in ("LANGUAGE", *_TERMINAL)}
    env.update(LC_ALL="C", LANG="C", TERM="dumb", NO_COLOR="1", SYSTEMD_COLORS="0", SYSTEMD_PAGER="cat")
    return env
