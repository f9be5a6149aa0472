"""What a person sees on stderr: progress while checks run, then the verdict.

Rich styling on a terminal; plain lines otherwise (journald, CI logs, pipes).
NO_COLOR is honoured by rich itself. Data (--json) goes to stdout, never here.

While a check runs, a thread of the console's reads the Context's Progress:
on a terminal it redraws one live line ("bandwidth  all_reduce 1 GiB  8 ranks
12.4 s") a few times a second, and erases it before any other line is
printed; in a log it writes a plain line when the stage changes, at most one
per progress.PLAIN_EVERY seconds, and nothing with --quiet. The live line is
plain text drawn with a carriage return and spaces, never an escape code.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

from rich.console import Console as RichConsole
from rich.markup import escape
from rich.table import Table

from preflight.pipeline.check import Check, Result
from preflight.base.errors import signal_name
from preflight.base.findings import Status
from preflight.base.progress import Progress, RateLimit, line as progress_line
from preflight.pipeline.report import Report
from preflight.base.units import fmt_seconds, fmt_value

LIVE_EVERY = 0.2  # the live line's redraw: the tenths of its clock move, for a stat of each rank's report
PLAIN_POLL = 0.5  # how often a log's stage is looked at; RateLimit decides what is written

_STYLE = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.SKIP: "dim",
    Status.ERROR: "bold magenta",
}


# Control characters other than newline and tab, escaped: a cause may quote what another user
# named (a file in /dev/shm), and an escape sequence there must not rewrite root's terminal.
_CONTROLS = {c: repr(chr(c))[1:-1] for c in [*range(0x00, 0x20), *range(0x7F, 0xA0)] if chr(c) not in "\n\t"}


def _shown(text: str) -> str:
    return text.translate(_CONTROLS)


class Console:
    def __init__(self, quiet: bool = False, verbose: bool = False, stream: TextIO | None = None):
        self.quiet = quiet
        self.verbose = verbose
        # stderr closed (2>&-) is None: the run must still reach its verdict.
        self.stream = stream or sys.stderr or open(os.devnull, "w")
        self.tty = self.stream.isatty()
        self.rich = RichConsole(file=self.stream, highlight=False) if self.tty else None
        # The Context's: the runner ends it on every way out of a check, which takes the live line down.
        self.progress = Progress(on_end=self._stop_live)
        self._write = threading.Lock()  # the live line and every other line, never interleaved
        self._live: _Ticker | None = None

    def line(self, text: str, style: str = "") -> None:
        text = _shown(text)
        self._stop_live()
        with self._write:
            try:
                if self.rich:
                    self.rich.print(f"[{style}]{escape(text)}[/]" if style else escape(text))
                else:
                    print(text, file=self.stream, flush=True)
            except (BrokenPipeError, ValueError):
                self._gone()

    def _gone(self) -> None:
        # Nobody reads stderr any more: keep going silently; the exit code and report still speak.
        self.stream, self.rich = open(os.devnull, "w"), None

    def note(self, text: str) -> None:
        if not self.quiet:
            self.line(f"preflight: {text}", "dim")

    def error(self, text: str) -> None:
        self.line(f"preflight: error: {text}", "bold red")

    def start(self, check: Check) -> None:
        """A check begins: on a terminal its live line (it leaves nothing behind, so
        --quiet keeps it too); in a log "  ... NAME", then its stage changes."""
        self._stop_live()
        if not self.tty:
            if self.quiet:
                return
            self.line(f"  ... {check.name}", "dim")
        self._live = _Ticker(self, check.name)
        self._live.start()

    def _stop_live(self) -> None:
        live, self._live = self._live, None
        if live is not None and live is not threading.current_thread():
            live.stop()

    def finish(self, result: Result) -> None:
        if self.quiet and result.status in (Status.PASS, Status.SKIP):
            return  # a WARN is a problem the page lists too: --quiet keeps it
        self.line(f"[{result.status}] {result.check} ({fmt_seconds(result.duration_seconds)}): {result.summary}", _STYLE[result.status])
        for text in result.lines:
            self.line(f"        {text}", "dim")
        for label, text in (("cause", result.cause), ("fix", result.remedy)):
            if text and text not in result.summary and (result.status not in (Status.PASS, Status.SKIP) or self.verbose):
                self.line(f"        {label}: {text}")
        if self.verbose:
            for m in result.measurements:
                bound = ""
                if m.floor is not None:
                    bound = f" (floor {fmt_value(m.floor, m.unit)})"
                elif m.ceiling is not None:
                    bound = f" (ceiling {fmt_value(m.ceiling, m.unit)})"
                labels = "".join(f" {k}={v}" for k, v in m.labels.items())
                self.line(f"        {m.name}{labels} = {fmt_value(m.value, m.unit)}{bound}", "dim")

    def summary(self, report: Report) -> None:
        self._stop_live()
        counts: dict[Status, int] = {}
        for r in report.checks:
            counts[r.status] = counts.get(r.status, 0) + 1
        tally = ", ".join(f"{n} {s.value.lower()}" for s, n in counts.items())
        kept = sum(1 for r in report.checks if "carried_from" in r.details)
        if kept:
            tally += f"; {kept} kept from an earlier run"
        if self.rich and not self.quiet and report.checks:
            table = Table(title=f"preflight {report.version} on {report.hostname}, profile {report.profile or 'none'}")
            for col in ("check", "status", "time", "summary"):
                table.add_column(col)
            for r in report.checks:
                table.add_row(r.check, f"[{_STYLE[r.status]}]{r.status}[/]", fmt_seconds(r.duration_seconds), escape(_shown(r.summary)))
            with self._write:
                try:
                    self.rich.print(table)
                except (BrokenPipeError, ValueError):
                    self._gone()
        style = {"pass": "bold green", "fail": "bold red"}.get(report.verdict.value, "bold magenta")
        verdict = report.verdict.value.upper()
        if report.interrupted_by_signal:  # stopped, not broken: it did not finish, so it vouches for nothing
            sig = signal_name(report.interrupted_by_signal)
            verdict, style = (f"FAIL, interrupted by {sig}", style) if report.verdict.value == "fail" else (f"INTERRUPTED by {sig}", "bold yellow")
        # The level is said where it is not the boot gate's (standard): a lighter or deeper look must not read as the gate's.
        level = f", level {report.level}" if report.level not in (None, "standard") else ""
        self.line(
            f"preflight: {verdict} (profile {report.profile or 'none'}{level}; {tally or 'no checks'}) "
            f"in {fmt_seconds(report.duration_seconds)}, exit {report.exit_code}",
            style,
        )


class _Ticker(threading.Thread):
    """Draws one check's progress until stopped: the live line on a terminal
    (erased when it stops), rate-limited plain lines in a log."""

    def __init__(self, console: Console, check: str):
        super().__init__(name=f"progress-{check}", daemon=True)
        self.console, self.check = console, check
        self._stopping = threading.Event()
        self._drawn = 0  # columns the live line covers now
        self._cols = 80
        self._limit = RateLimit()
        self._limit.take(None, time.monotonic())  # "  ... NAME" was the first line

    def stop(self) -> None:
        """Returns once the live line is off the screen. If the wait is cut short
        (a signal), the thread still erases the line on its own as it ends."""
        self._stopping.set()
        if self.ident is not None:  # a signal between making it and starting it leaves one never run
            self.join()

    def run(self) -> None:
        c = self.console
        try:
            while True:
                check, stage, elapsed = c.progress.now()
                if check == self.check:
                    if c.tty:
                        self._cols = _width(c.stream)
                        self._draw(progress_line(check, stage, elapsed, self._cols - 1))
                    elif self._limit.take(stage, time.monotonic()):
                        self._plain(f"  ... {progress_line(check, stage, elapsed)}")
                if self._stopping.wait(LIVE_EVERY if c.tty else PLAIN_POLL):
                    break
        finally:
            self._draw("")

    def _draw(self, text: str) -> None:
        """Over the line drawn before: a carriage return, the text, spaces over
        what is left of the old one; "" erases it and leaves the cursor at the line's start."""
        text = _shown(text)
        c = self.console
        with c._write:
            if not self._drawn and not text:
                return
            # Erasing, two more: the terminal echoes Ctrl-C as "^C" where the cursor stood.
            cover = min(max(len(text), self._drawn) if text else self._drawn + 2, self._cols - 1)
            try:
                c.stream.write(f"\r{text.ljust(cover)}" + ("" if text else "\r"))
                c.stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                self._stopping.set()
                c._gone()
            self._drawn = cover

    def _plain(self, text: str) -> None:
        c = self.console
        with c._write:
            if self._stopping.is_set():
                return  # the check ended meanwhile: its result line comes next, no stale stage before it
            try:
                print(text, file=c.stream, flush=True)
            except (BrokenPipeError, ValueError, OSError):
                self._stopping.set()
                c._gone()


def _width(stream: TextIO) -> int:
    """The terminal's columns now (it may be resized while a check runs)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80
