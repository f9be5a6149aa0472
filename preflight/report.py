"""The verdict as machines read it: the Report model and its atomic write."""

from __future__ import annotations

import os
import tempfile
from datetime import datetime
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from preflight.check import Result, Status
from preflight.errors import UsageError

SCHEMA_VERSION = 1
# Where the systemd units write and `serve` reads; a manual run writes only with --report.
DEFAULT_REPORT_PATH = Path("/var/lib/preflight/report.json")


class Verdict(str, Enum):
    PASS = "pass"  # warnings allowed
    FAIL = "fail"  # a check failed: drain the node
    ERROR = "error"  # preflight itself broke: the node is not vouched for

    def __str__(self) -> str:
        return self.value


EXIT_CODES = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.ERROR: 3}
EXIT_USAGE = 2


class Report(BaseModel):
    model_config = ConfigDict(validate_assignment=True)

    schema_version: int = SCHEMA_VERSION
    tool: str = "preflight"
    version: str
    hostname: str
    boot_id: str | None  # a report from before the last reboot says nothing about this boot
    profile: str | None
    profile_chosen_because: str | None = None
    config: str | None = None
    started_at: datetime  # RFC 3339, UTC
    finished_at: datetime
    duration_seconds: float
    verdict: Verdict
    exit_code: int
    keep_going: bool = False
    interrupted_by_signal: int | None = None
    checks: list[Result]


def verdict_of(results: list[Result]) -> Verdict:
    """Any FAIL is a node problem (exit 1); else any ERROR is a tool problem
    (exit 3). Both are non-zero, so a gate fails closed either way."""
    statuses = {r.status for r in results}
    if Status.FAIL in statuses:
        return Verdict.FAIL
    if Status.ERROR in statuses:
        return Verdict.ERROR
    return Verdict.PASS


def check_writable(path: Path) -> Path:
    """Refuse, before any check runs, a report path that could not be written.

    Returns the path to write: a symlink is followed to its target, so the
    atomic rename replaces the file it points at, never the link itself.
    """
    target = path.resolve()
    if target.is_dir():
        raise UsageError(f"report {path}: is a directory; give a file path such as {path / 'report.json'}")
    if target.exists() and not target.is_file():
        raise UsageError(f"report {path}: is not a regular file (a device, pipe or socket would be replaced); give a file path")
    parent = target.parent
    if not parent.is_dir():
        raise UsageError(f"report {path}: directory {parent} does not exist; create it (mkdir -p {parent}) or choose another path")
    try:
        # Trying is the only honest test: root passes os.access() on a read-only mount.
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".preflight-probe-"):
            pass
    except OSError as e:
        raise UsageError(f"report {path}: cannot write in {parent} ({e.strerror}); choose a writable directory") from None
    return target


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the same directory, fsync, rename: a reader (or a crash)
    sees the old report or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)
