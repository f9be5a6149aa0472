"""The last report on disk, and what it vouches for now.

`serve`, `status`, `status --npd`, `slurm-healthcheck` and `kube-label` never
run a check: they read the report the last `preflight run` wrote and
judge it here, in one place, so they cannot disagree. A report vouches for the
node only if it passed, in this boot (a pass before the last reboot says
nothing about the GPUs now), and, where the caller sets a limit, recently;
and only while no run that started after it has died without writing its own
(run_record: a run under way leaves the last verdict standing).
`load` gives the Report model (serve renders all of it); `load_view` gives
what the judge reads, without importing pydantic where the file is in the
form preflight writes (report_view), so `status` starts fast.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from preflight.base.actions import NOTHING, Next
from preflight.base import pathtrust, safefile
from preflight.base.errors import signal_name
from preflight.outputs.record import run_record
from preflight.outputs.record.run_record import Started
from preflight.pipeline.report_paths import default_report_path
from preflight.pipeline.report_schema import VOUCHING, Verdict
from preflight.pipeline.report_view import ReportView, view

if TYPE_CHECKING:
    from preflight.pipeline.report import Report

# A report is a few hundred KiB at most (8 GPUs, every figure); past this it is not ours.
MAX_BYTES = 16 * 2**20


class State(str, Enum):
    OK = "ok"
    MISSING = "missing"  # preflight has not run here (or the path is wrong)
    UNREADABLE = "unreadable"  # permissions, I/O error, a directory
    INVALID = "invalid"  # not JSON, not a preflight report, or a newer schema

    def __str__(self) -> str:
        return self.value


# NamedTuples, not dataclasses, for `status`'s start-up (see report_view).
class Loaded(NamedTuple):
    state: State
    # The Report model (load), or what a judge reads of it (load_view): the same names.
    report: Report | ReportView | None = None
    error: str | None = None  # why it is not OK, in words
    raw: bytes = b""  # the file as written, for serve's /report
    started: Started | None = None  # the record of a run that started and has not written its report


def load(path: Path) -> Loaded:
    """The report as the Report model, for readers of all of it (serve)."""
    started = run_record.read(path)  # first: a run that ends meanwhile has written its report by the time it is read
    data = _read(path)
    return (data if isinstance(data, Loaded) else _validated(path, data))._replace(started=started)


def load_view(path: Path) -> Loaded:
    """The report as a judge reads it (status, slurm-healthcheck, kube-label): without
    pydantic where it is in the form `preflight run` writes, else exactly as ``load``."""
    started = run_record.read(path)
    data = _read(path)
    if isinstance(data, Loaded):
        return data._replace(started=started)
    seen = view(data)
    return (Loaded(State.OK, seen, raw=data) if seen is not None else _validated(path, data))._replace(started=started)


def _read(path: Path) -> bytes | Loaded:
    try:
        # Reached as safefile walks a path (a link only where no other user could have made it),
        # a regular file only: a FIFO at the report's path must not hang status or a scrape.
        fd, foreign = safefile.open_own(path)
        with open(fd, "rb") as f:
            # A report another user could have written (a PASS stamped with this boot's id, in a
            # shared directory before the first run) would vouch for the node, or drain it.
            if foreign:
                return Loaded(State.UNREADABLE, error=f"not trusted: the report {path} could have been written by another user ({foreign}); "
                                                      "let `preflight run` write it in a directory only root (or you) can change")
            data = f.read(MAX_BYTES + 1)
    except safefile.NotRegular:
        return Loaded(State.UNREADABLE, error=f"cannot read the report {path}: not a regular file")
    except safefile.LinkAtName as e:
        return Loaded(State.UNREADABLE, error=f"not trusted: the report {path} is a symlink another user could have made ({e.why}); give the real path")
    except FileNotFoundError:
        how = "(`preflight run` writes it there)" if path == default_report_path() else f"with --report {path}"
        return Loaded(State.MISSING, error=f"no report at {path}: preflight has not run here {how}")
    except pathtrust.Untrusted as e:
        return Loaded(State.UNREADABLE, error=f"not trusted: the report {path}: {e.strerror}")
    except OSError as e:
        return Loaded(State.UNREADABLE, error=f"cannot read the report {path}: {e.strerror or e}")
    except ValueError as e:  # a NUL in the path, from a config file or variable
        return Loaded(State.UNREADABLE, error=f"cannot read the report {path!r}: {e}")
    if len(data) > MAX_BYTES:
        return Loaded(State.INVALID, error=f"not a preflight report: {path} is over {MAX_BYTES // 2**20} MiB")
    return data


def _validated(path: Path, data: bytes) -> Loaded:
    from pydantic import ValidationError

    from preflight.pipeline.report import SCHEMA_VERSION, Report

    try:
        return Loaded(State.OK, Report.model_validate_json(data), raw=data)
    except ValidationError as e:
        err = e.errors()[0]
        if err["loc"] == ("schema_version",) and err["type"] == "less_than_equal":
            return Loaded(State.INVALID, error=f"{path} is a report of schema {err['input']}, from a newer preflight than this one "
                                               f"(it reads schema {SCHEMA_VERSION}): read it with that preflight, or upgrade this one")
        where = ".".join(str(p) for p in err["loc"]) or "the top level"
        return Loaded(State.INVALID, error=f"not a preflight report: {path} ({where}: {err['msg']})")


class Cached:
    """``load`` for a server: parses again only when the file changed (the
    writer replaces it by rename, so a new inode or mtime means a new report)."""

    def __init__(self, path: Path):
        import threading  # here: `status` needs no threads

        self.path = path
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._loaded: Loaded | None = None

    def __call__(self) -> Loaded:
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            key = None
        started = run_record.read(self.path)  # each time: a run starts and dies without touching the report
        with self._lock:
            if key is None or key != self._key or self._loaded is None:
                self._loaded, self._key = load(self.path), key
            if self._loaded.started != started:
                self._loaded = self._loaded._replace(started=started)
            return self._loaded


def this_boot() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


class Standing(NamedTuple):
    """What the last report says about the node now."""

    vouched: bool | None  # True: a pass of this boot; False: not vouched; None: no usable report
    reason: str  # one line, for a person, a Slurm drain reason or an NPD message
    current_boot: bool | None = None
    age_seconds: float | None = None
    under_way: datetime | None = None  # when the run now under way started: the last verdict stands meanwhile
    # What the report asks be done (preflight/base/actions.py) while it speaks for this boot; NOTHING else.
    action: Next = NOTHING
    check: str | None = None  # the check whose finding decided the action
    gpus: int | None = None  # the GPUs the report's run found on the node (its shape): the scheduler's view is held to it


def booted_at() -> datetime | None:
    """When this machine booted (btime in /proc/stat)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return datetime.fromtimestamp(int(line.split()[1]), timezone.utc)
    except (OSError, ValueError):
        pass
    return None


# What readers add where the run that did not finish followed a pass that still stands on its own:
# the prolog and the Kubernetes recheck then take a fresh look rather than refuse.
PASSED_BEFORE = "; the last run that finished passed ({})"


# Characters that are not printable shown as escapes (control characters, C1 included, and the
# line and paragraph separators and bidirectional overrides, which reorder or break what a reader
# sees): a reason quotes a check's summary, which may carry what another host posted (a group
# peer's name at the meeting), and `status`, NPD, slurm-healthcheck (and Slurm's drain reason) and
# kube-label print it on one line to root's terminal or a log: an escape sequence must not rewrite
# the screen, nor a newline forge a line. Line breaks and tabs are a space, as the reason always had them.
def printable(text: str) -> str:
    """``text`` on one line: line breaks and tabs a space, every other character str.isprintable
    refuses shown as its escape (ESC as \\x1b, U+202E as \\u202e)."""
    return "".join(" " if c in "\n\r\t" else c if c.isprintable() else repr(c)[1:-1] for c in text)


def standing(loaded: Loaded, boot_id: str | None, now: datetime, max_age: float | None = None, booted: datetime | None = None) -> Standing:
    """Judge the last report, and the record of a run that started after it: the one
    rule every reader of it applies. Without a boot id on either side, a report
    that finished (or a run that started) before ``booted`` is of an earlier boot.
    The reason is one printable line (``printable``)."""
    st = _standing(loaded, boot_id, now, max_age, booted)
    return st._replace(reason=printable(st.reason))


def _standing(loaded: Loaded, boot_id: str | None, now: datetime, max_age: float | None = None, booted: datetime | None = None) -> Standing:
    r = loaded.report
    run = _newer_run(loaded.started, r, boot_id, booted)
    dead = run is not None and not (run.alive or (run.alive is None and now < run.deadline))
    # Alive past every check's deadline is a run stuck for good (an fsync on a hung disk, a
    # stopped process): it vouches for nothing, however long it lingers.
    stuck = run is not None and run.alive is True and now >= run.deadline
    if dead or stuck:
        age = (now - run.started_at).total_seconds()
        current = None if r is None else _current(r, boot_id, booted)
        what = "is still running past its deadline" if stuck else "did not finish"
        reason = f"a run started at {utc(run.started_at)} {what} ({ago(age)})"
        if dead and r is not None and standing(loaded._replace(started=None), boot_id, now, max_age, booted).vouched:
            # Said, because what comes next differs: a fresh look (the Slurm prolog's, the
            # recheck's) keeps that pass's results and may vouch again; after a run of an
            # earlier boot, a failure or a pass too old, only a run as deep as the gate may.
            reason += PASSED_BEFORE.format(ago((now - r.finished_at).total_seconds()))
        return Standing(False, reason, current, None if r is None else (now - r.finished_at).total_seconds())
    under_way = run.started_at if run is not None else None
    if r is None:
        return Standing(None, loaded.error or f"report {loaded.state}", under_way=under_way)
    age = (now - r.finished_at).total_seconds()
    current = _current(r, boot_id, booted)
    when = ago(age)

    then, check = (Next(r.action, r.domain, r.action_source), r.action_check) if current is not False else (NOTHING, None)
    gpus = r.shape.gpus if r.shape is not None else None  # NodeShape or the view's ShapeView

    def said(vouched: bool, reason: str) -> Standing:
        return Standing(vouched, reason, current, age, under_way, then, check, gpus)

    if r.verdict != Verdict.PASS:
        reason = _why_not(r) + f" ({when})"
        last = r.last_success_at
        if r.interrupted_by_signal and not any(c.status == "FAIL" for c in r.checks) and last is not None and current is True \
                and (booted is None or last >= booted) and -300 <= (now - last).total_seconds() <= (max_age if max_age is not None else float("inf")):
            # A run a signal stopped, with nothing failed: as a run that died, no verdict on the node.
            reason += PASSED_BEFORE.format(ago((now - last).total_seconds()))
        return said(False, reason)
    if current is False:
        return said(False, f"last pass was before the last reboot ({when}); run preflight again")
    if age < -300:
        return said(False, f"report is dated {-age:.0f} s in the future: check the clock")
    if max_age is not None and age > max_age:
        return said(False, f"last pass is older than the {max_age:g} s allowed ({when}); run preflight again")
    return said(True, f"passed {when}, profile {r.profile}")


def _current(r: Report | ReportView, boot_id: str | None, booted: datetime | None) -> bool | None:
    if boot_id is not None and r.boot_id is not None:
        return r.boot_id == boot_id
    return None if booted is None else r.finished_at >= booted


def _newer_run(run: Started | None, r: Report | ReportView | None, boot_id: str | None, booted: datetime | None) -> Started | None:
    """The record of a run that started after the report and in this boot, or None. A run
    of an earlier boot is the boot rule's: its report, if any, is of that boot too."""
    if run is None or (r is not None and r.started_at >= run.started_at):
        return None  # settled: the report is that run's, or a later one's
    if boot_id is not None and run.boot_id is not None:
        return run if run.boot_id == boot_id else None
    return None if booted is not None and run.started_at < booted else run


def ago(seconds: float) -> str:
    """How long ago, as every reader's line says it: 40 s ago, 2.0 h ago."""
    return f"{seconds / 3600:.1f} h ago" if seconds >= 3600 else f"{max(seconds, 0):.0f} s ago"


def utc(t: datetime) -> str:
    """A time as every reader's line writes it: UTC, to the second, 2026-11-26T22:24:18Z."""
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _why_not(r: Report | ReportView) -> str:
    bad = [c for c in r.checks if c.status not in VOUCHING]  # Status.ok, for a Status or its value
    failed = [c for c in bad if c.status == "FAIL"]
    if failed:  # a node problem found is the reason, even in a run a signal then stopped
        return f"{failed[0].check} FAIL: {failed[0].summary}"
    if r.interrupted_by_signal:
        return f"a run started at {utc(r.started_at)} was interrupted by {signal_name(r.interrupted_by_signal)}"
    if not bad:
        return f"verdict {r.verdict}"
    first = bad[0]
    return f"{first.check} {first.status}: {first.summary}"


def now() -> datetime:
    return datetime.now(timezone.utc)
