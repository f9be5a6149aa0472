"""What a launch leaves behind, read back: each rank's report and log, torchrun's own log
and its failure summary, gathered into a ``Finished`` (gpuwork/launch.py runs the launch).

Ranks write their JSON atomically, so a report is whole or absent; a log is read from its
end, at most so much of it.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 20
TEXT_LIMIT = 4 << 20  # the most read back of any one log a worker leaves (NCCL's INFO logs)


@dataclass(frozen=True)
class Finished:
    returncode: int | None  # None: killed at the deadline or once settled
    timed_out: bool
    seconds: float
    reports: dict[int, Any]  # rank -> what it wrote
    unreadable: dict[int, str]  # rank -> why its file could not be read
    log_tail: list[str]  # the launcher's (torchrun's, or the plain worker's) output
    settled: bool = False  # ended early: the caller saw every rank finished or stuck
    rank_logs: dict[int, list[str]] = field(default_factory=dict)  # rank -> last lines of its output
    rank_exits: dict[int, int] = field(default_factory=dict)  # from torchrun's summary; negative: signal
    root_cause: int | None = None  # the rank torchrun saw fail first
    texts: dict[str, str] = field(default_factory=dict)  # other *.log files the ranks left, by name
    leftover: list[str] = field(default_factory=list)  # processes that outlived the sweep
    endpoint: str | None = None
    world: dict[str, Any] | None = None  # run as a stage of a shared launch: which launch, which stage (gpuwork/world.py)
    isolation: dict[str, Any] | None = None  # where the ranks' sockets lived (tether.isolation)

    @property
    def how_it_ended(self) -> str:
        """"exit 1", "killed by SIGSEGV", "killed at the deadline after 60 s": for causes."""
        if self.timed_out:
            return f"killed at the deadline after {self.seconds:.0f} s"
        if self.settled:
            return f"stopped after {self.seconds:.0f} s, once no rank made progress"
        return exit_words(self.returncode)

    def last_line(self, rank: int) -> str:
        lines = self.rank_logs.get(rank) or []
        return lines[-1] if lines else "none"


def read_report(out_dir: Path, rank: int) -> Any:
    """What ``rank`` has written to ``out_dir`` so far (atomically, so whole or absent), or None."""
    return read_json(out_dir / f"rank{rank}.json")


def read_json(path: Path) -> Any:
    """A file a rank wrote atomically: whole, or None while absent or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_out(out_dir: Path) -> dict[str, dict]:
    """What the ranks left in ``out_dir``: each rank's report (or why it is unreadable),
    the last lines of each rank's log, and any other log by name (NCCL's)."""
    reports, unreadable, rank_logs, texts = {}, {}, {}, {}
    for path in sorted(out_dir.iterdir()):
        rank = path.stem.removeprefix("rank")
        if path.suffix == ".json" and rank.isdigit():
            try:
                reports[int(rank)] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                unreadable[int(rank)] = f"{path.name} is not JSON ({e})"
        elif path.suffix == ".log" and rank.isdigit():
            rank_logs[int(rank)] = tail_lines(path)
        elif path.suffix == ".log":
            texts[path.name] = _read_tail(path, TEXT_LIMIT)
    return {"reports": reports, "unreadable": unreadable, "rank_logs": rank_logs, "texts": texts}


# torchrun's failure summary:  "  rank      : 1 (local_rank: 1)" then "  exitcode  : -9 (pid: 8084)"
# Keyed by local rank where torchrun says it: each node reads only its own ranks.
_SUMMARY = re.compile(r"^\s*rank\s*:\s*(\d+)(?:\s*\(local_rank:\s*(\d+)\))?.*?^\s*exitcode\s*:\s*(-?\d+)", re.M | re.S)


def torchrun_exits(lines: list[str]) -> dict[int, int]:
    """rank -> exit code from torchrun's ChildFailedError summary (negative: killed by that signal)."""
    return {int(local or rank): int(code) for rank, local, code in _SUMMARY.findall("\n".join(lines))}


def torchrun_root_cause(lines: list[str]) -> int | None:
    """The rank under torchrun's "Root Cause (first observed failure)"."""
    text = "\n".join(lines)
    at = text.find("Root Cause")
    found = _SUMMARY.search(text, at) if at >= 0 else None
    return int(found.group(2) or found.group(1)) if found else None


def exit_words(code: int | None) -> str:
    """"exit 1", "killed by SIGKILL"."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def _read_tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def tail_lines(log: Path, n: int = LOG_TAIL_LINES) -> list[str]:
    lines = _read_tail(log, 64 * 1024).splitlines()
    return [line for line in lines if line.strip()][-n:]
