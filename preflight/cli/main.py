"""The `preflight` command's entry point: `status` and `version` without Typer.

node-problem-detector and Slurm run `preflight status` every few minutes, so
it must start in a few tens of milliseconds. Typer takes longer than that to
import, and to read a command's options (--help's too) it builds pydantic
adapters. So ``main`` runs `version`, and `status` in the plain form scripts
use (``status [--npd] [--json] [--report P] [--config P] [--max-age N]``,
each at most once), with preflight.cli.plain alone; anything else goes to the
Typer app (preflight.cli.app), which owns every usage error and gives the
same answer for these forms (tests/cli/test_main.py holds the two to it).
Each command's body is one function of preflight.cli.plain that both paths
call. The console script and `python -m preflight` both start here.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from preflight.cli.plain import guarded, status, version


def main() -> None:
    argv = sys.argv[1:]
    if argv == ["version"]:
        command, args = version, {}
    elif (parsed := parse_status(argv)) is not None:
        command, args = status, parsed
    else:
        from preflight.cli import app

        app.main()
        return
    try:
        code = guarded(command, **args)
    except KeyboardInterrupt:
        code = 130  # as Typer exits on Ctrl-C
    sys.exit(code)


def parse_status(argv: list[str]) -> dict[str, Any] | None:
    """`status`'s arguments, where Typer would read them exactly so; None for anything else."""
    if not argv or argv[0] != "status":
        return None
    args: dict[str, Any] = {"report": None, "npd": False, "max_age": None, "config": None, "json_out": False}
    seen = set()
    rest = iter(argv[1:])
    for token in rest:
        name, eq, value = token.partition("=")
        if name in seen or name not in _OPTIONS:
            return None
        seen.add(name)
        key = _OPTIONS[name]
        if isinstance(args[key], bool):
            if eq:
                return None
            args[key] = True
            continue
        if not eq:
            value = next(rest, "")
        if not value or value.startswith("-"):
            return None
        if key == "max_age":
            if not _DECIMAL.fullmatch(value):
                return None
            args[key] = float(value)
        else:
            try:
                os.stat(value)
            except OSError:
                pass  # Typer takes a path that is not there
            else:
                if not os.access(value, os.R_OK):
                    return None  # Typer refuses it: "is not readable"
            args[key] = Path(value)
    return args


_OPTIONS = {"--report": "report", "--npd": "npd", "--max-age": "max_age", "--config": "config", "--json": "json_out"}
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")


