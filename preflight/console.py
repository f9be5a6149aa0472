"""What a person sees on stderr: progress while checks run, then the verdict.

Rich styling on a terminal; plain lines otherwise (journald, CI logs, pipes).
NO_COLOR is honoured by rich itself. Data (--json) goes to stdout, never here.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console as RichConsole
from rich.markup import escape
from rich.table import Table

from preflight.check import Check, Result, Status
from preflight.report import Report
from preflight.units import fmt_seconds, fmt_value

_STYLE = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.SKIP: "dim",
    Status.ERROR: "bold magenta",
}


class Console:
    def __init__(self, quiet: bool = False, verbose: bool = False, stream: TextIO | None = None):
        self.quiet = quiet
        self.verbose = verbose
        # stderr closed (2>&-) is None: the run must still reach its verdict.
        self.stream = stream or sys.stderr or open(os.devnull, "w")
        self.rich = RichConsole(file=self.stream, highlight=False) if self.stream.isatty() else None

    def line(self, text: str, style: str = "") -> None:
        try:
            if self.rich:
                self.rich.print(f"[{style}]{escape(text)}[/]" if style else escape(text))
            else:
                print(text, file=self.stream, flush=True)
        except (BrokenPipeError, ValueError):
            # Nobody reads stderr any more: keep going silently; the exit code and report still speak.
            self.stream, self.rich = open(os.devnull, "w"), None

    def note(self, text: str) -> None:
        if not self.quiet:
            self.line(f"preflight: {text}", "dim")

    def error(self, text: str) -> None:
        self.line(f"preflight: error: {text}", "bold red")

    def start(self, check: Check) -> None:
        if not self.quiet:
            self.line(f"  ... {check.name}", "dim")

    def finish(self, result: Result) -> None:
        if self.quiet and result.status.ok:
            return
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
                table.add_row(r.check, f"[{_STYLE[r.status]}]{r.status}[/]", fmt_seconds(r.duration_seconds), escape(r.summary))
            try:
                self.rich.print(table)
            except (BrokenPipeError, ValueError):
                self.stream, self.rich = open(os.devnull, "w"), None
        style = {"pass": "bold green", "fail": "bold red"}.get(report.verdict.value, "bold magenta")
        self.line(
            f"preflight: {report.verdict.value.upper()} (profile {report.profile or 'none'}; {tally or 'no checks'}) "
            f"in {fmt_seconds(report.duration_seconds)}, exit {report.exit_code}",
            style,
        )
