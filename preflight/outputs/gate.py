"""`preflight run` once its settings are read: the plan run under the lock, and
its verdict left where machines read it.

Both paths are refused before a check runs. Under the lock, before the first
check, the run records beside its report that it started (run_record): a run
that dies before its report is written leaves the node not vouched, where the
last report alone would go on vouching. The verdict is then written so that no
file and no console line says PASS of a run whose report is not on disk: see
``write``. Neither file is ever
written through a link another user could have planted (base/safefile.py).
"""

from __future__ import annotations

import os
import stat
import sys
import traceback
from contextlib import ExitStack
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

from preflight.base import pathtrust, safefile
from preflight.base.errors import Interrupted, UsageError, signal_name
from preflight.base.signals import interrupting
from preflight.base.findings import Status
from preflight.outputs.record import history, history_judge, last_report, run_record, trends
from preflight.outputs.exporters import metrics
from preflight.pipeline import head_start, plan as pipeline, report as reports
from preflight.pipeline import lock
from preflight.pipeline.lock import LockHeld, run_lock

if TYPE_CHECKING:
    from preflight.outputs.exporters.console import Console
    from preflight.pipeline.expectations import DriftExpect
    from preflight.pipeline.settings import Settings

# Past the checks' own deadlines: reading the node's shape, starting and ending the ranks, writing the verdict.
SLACK_SECONDS = 120.0


def run(s: Settings, console: Console, if_idle: bool = False, if_locked: str = "error", early: Started | None = None) -> reports.Report | None:
    """The run's report, written; None when nothing ran and the last report stands:
    ``if_idle`` found a GPU held, or with ``if_locked="skip"`` another run still held
    the lock after ``s.lock_timeout``. Raises UsageError before any check for bad input.
    ``early``: NVML's child the CLI began first (nvml_child.early), this run's from here on."""
    ahead = head_start.HeadStart(s, early)
    try:
        return _gated(s, console, if_idle, if_locked, ahead)
    finally:
        ahead.close()  # what started ahead of the plan ends with the run, however it ends (bad input too)


def _gated(s: Settings, console: Console, if_idle: bool, if_locked: str, ahead: head_start.HeadStart) -> reports.Report | None:
    report_path = None
    if s.report is not None and not s.report_is_default:
        report_path = safefile.check(s.report, f"report {s.report}")
    elif s.report is not None:
        try:
            report_path = default_report(s.report)
        except UsageError as e:
            # Nobody asked for this file: a home that cannot be written (a pod's arbitrary user, a
            # read-only root) is no fault of the node's, and the run's verdict still stands.
            console.line(f"preflight: warning: {e}; this run writes no report")
    textfile = metrics.check_textfile_dir(s.textfile_dir) if s.textfile_dir is not None else None
    with interrupting():  # the runner stops the running check's workers and still writes the report
        pipeline.check_inputs(s)  # the workers' interpreter is known good before anything runs it
        python = str(s.python) if s.python is not None else sys.executable
        if who := pipeline.check_python_trusted(s):  # no other user's unless the site accepts it: the head start below runs it
            console.line(f"preflight: warning: the workers' Python {python} runs as root, and another user decides what it does: {who}")
        # Asked before NVML is read (the CLI's early reading asked it first): a run that holds the lock
        # now may be loading the GPUs while the plan reads them, and may be gone by the time this run takes the lock.
        other_run = lock.held(s.lock_file) is not False
        try:
            ahead.begin(s, python, ranks_too=not if_idle and not other_run)
            return _planned(s, console, if_idle, if_locked, other_run or ahead.found_held, ahead, report_path, textfile)
        finally:
            ahead.close()  # under the handlers: a second signal still ends the ranks first


def default_report(path: Path) -> Path:
    """``path``, the default report (report_paths.default_report_path: no --report, none configured),
    proven writable as ``safefile.check`` proves a given one. Its directory is made where missing
    (root's 0755, for serve's user to read; anyone else's 0700, as the XDG spec asks), each part
    reached without a link another user could have made, and refused where another user owns
    it or may write in it, as the lock's is, or under a directory another user could rename, or on
    a network filesystem. Raises UsageError (one line) where it cannot be written: `run` says
    so and goes on without a report, as nobody asked for this one."""
    what, fix = f"report {path} (the default: no --report given)", "give --report FILE, or --scratch to write no report"
    mine = os.geteuid()
    if shared := network_fs(path.parent):
        # A home on NFS is every node's: each would write the same report, status would read another
        # node's, and SQLite's WAL (history.db) does not work over a network filesystem.
        raise UsageError(f"{what}: {path.parent} is on {shared}, shared between nodes; give --report FILE on a local disk, or --scratch")
    try:
        safefile.make_dirs(path.parent, 0o755 if mine == 0 else 0o700)
        st = os.stat(path.parent)
    except pathtrust.Untrusted as e:
        raise UsageError(f"{what}: {e.strerror}; {fix}") from None
    except OSError as e:
        raise UsageError(f"{what}: cannot make {e.filename or path.parent} ({e.strerror or e}); {fix}") from None
    if st.st_uid not in (0, mine):
        raise UsageError(f"{what}: its directory {path.parent} is {pathtrust.owner(st.st_uid)}'s, who could replace the report; "
                         f"remove it (preflight makes it anew), or {fix}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(f"{what}: other users can write its directory {path.parent} (mode {stat.S_IMODE(st.st_mode):04o}), "
                         f"so they could replace the report; chmod go-w {path.parent}, or {fix}")
    if why := pathtrust.steerable(path.parent):  # one who can rename a directory above could swap in their own
        raise UsageError(f"{what}: {why}, and another user could swap a directory on the way to it; {fix}")
    return safefile.check(path, what, fix=fix)


# Filesystems one node's state must not live on (/proc/self/mountinfo's type field).
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "fuse.sshfs", "fuse.glusterfs", "9p", "afs")


def network_fs(directory: Path, mountinfo: str | None = None) -> str | None:
    """The network filesystem ``directory`` (or its nearest existing parent) is on, or None;
    ``mountinfo``: /proc/self/mountinfo's text, read where not given."""
    from preflight.readers.system import shm_mount

    here = directory
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        mounts = shm_mount.parse_mountinfo(mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text())
    except OSError:
        return None
    found = shm_mount.mount_of(os.path.realpath(here), mounts)
    return found.fstype if found is not None and found.fstype in NETWORK_FS else None


def _node_profile_kept(report_path: Path, the_plan: pipeline.Plan) -> str | None:
    """Why a run writing the node's report (the default, or the config's) must leave it alone: it holds a verdict of another
    profile (the node's gate's h100-sxm, and this a `--profile cpu` dry run by hand), which this
    run's verdict would replace and so vouch for the node on checks it never ran."""
    loaded = last_report.load_view(report_path)
    theirs = loaded.report.profile if loaded.report is not None else None
    ours = the_plan.profile.name if the_plan.profile is not None else None
    if theirs and ours and theirs != ours:
        return f"{report_path} holds this node's profile {theirs} verdict, which a run of profile {ours} does not replace; give --report FILE to keep this one"
    return None


def _planned(s: Settings, console: Console, if_idle: bool, if_locked: str, other_run: bool, ahead: head_start.HeadStart,
             report_path: Path | None, textfile: Path | None) -> reports.Report | None:
    """``run`` from the plan on, with what started ahead of it (NVML's reading, perhaps the lock and the ranks)."""
    the_plan = pipeline.plan(s, ahead.reading)  # may ask NVML (bounded), so it runs under the handlers too
    # For a profile chosen for this run, or one without GPUs: the node's own (its config's, `auto`'s) may
    # change (a site's edit, a new GPU, an upgrade), and the gate's verdict must follow it; a profile
    # that judges no GPU never stands in for one that does.
    gpuless = the_plan.profile is not None and not the_plan.profile.has_gpus
    if report_path is not None and s.report_of_node and (s.profile_given or gpuless) and (kept := _node_profile_kept(report_path, the_plan)):
        # The node's metrics too, where the config names them: they would say this run's verdict.
        textfile = None if s.textfile_of_node else textfile
        console.line(f"preflight: {kept}")
        report_path = None
    if if_idle and (held := pipeline.gpus_busy(s, the_plan.inventory)):
        console.note(f"not run: {held}; the last report stands")
        return None
    with ExitStack() as locked:
        def waiting(who: str) -> None:
            # The NVML facts read so far are of a node another run was using (its processes,
            # its clocks): the checks read the node again once that run is done.
            if the_plan.inventory:
                the_plan.inventory.forget()
            console.note(f"waiting for {who} to release {s.lock_file}")
        try:
            if not ahead.locked:  # else held since before the plan, which read NVML under it
                locked.enter_context(run_lock(s.lock_file, s.lock_timeout, waiting))
            if other_run and the_plan.inventory:
                the_plan.inventory.forget()  # read while another run held the node: read it again
        except LockHeld as e:
            if if_locked != "skip":
                raise
            # Said even with -q: this run judged nothing, and whoever reads its output must know.
            console.line(f"preflight: not run: another preflight run ({e.holder}) still holds {s.lock_file} after {s.lock_timeout:g} s; "
                         "the last report stands, and that run writes its own verdict")
            return None
        # From now, not from the plan: the wait for the lock (up to --lock-timeout) is not the run's.
        deadline = datetime.now(timezone.utc) + timedelta(seconds=pipeline.seconds_at_most(the_plan, s) + SLACK_SECONDS)
        # Only beside a report this run will write: a record no report settles would say, once this
        # run is gone, that a run died after the report, and leave the node not vouched (drained).
        record = begin(report_path, the_plan.started_at, deadline, console) if report_path is not None else None
        try:
            result = pipeline.execute(the_plan, s, console, worlds=ahead.worlds)
        except UsageError:
            if record is not None:
                _settle(record)  # bad input found late (one line, exit 2): nothing was looked at, nothing is left
            raise
        result.level, result.level_chosen_because = the_plan.level, the_plan.level_chosen_because
        before = reports.read_previous(report_path)
        kept = reports.carry_forward(result, before, the_plan.profile.checks if the_plan.profile else [], across_nodes=the_plan.group is not None)
        _tell_kept(kept, result, console)
        earlier = reports.earlier_success(before) or (metrics.previous_success(textfile) if textfile else None)
        result.last_success_at = result.finished_at if result.verdict == reports.Verdict.PASS else earlier
        kept_history, cut = None, None
        if report_path is not None:
            kept_history = Keep(history.path_for(report_path), s.history_days, s.history_runs)
            try:
                judged = judge_history(result, kept_history.path, the_plan.profile.drift if the_plan.profile else None, s, console)
            except Interrupted as sig:
                # Every check ran: the report is written first, then the signal ends the run (a wait
                # on a locked history must not cost the node its verdict).
                cut, judged = sig, False
                result.history = reports.Result(check=history.CHECK, status=Status.SKIP,
                                                summary=f"history not judged: interrupted by {signal_name(sig.signum)}")
            if not judged:
                kept_history = None  # said once: a history that cannot be read is not written to either
        write(result, textfile, report_path, console, record, earlier, kept_history)
        if cut is not None:
            raise cut
    return result


class Keep(NamedTuple):
    """Where a run's history goes, and how much of it is kept (Settings)."""

    path: Path
    days: float
    runs: int


def judge_history(result: reports.Report, db: Path, expect: DriftExpect | None, s: Settings, console: Console) -> bool:
    """The run's ``history`` result (drift, lemons: outputs/record/history_judge.py), the report's
    ``history``, judged before the report is written and printed where it says more than PASS.
    A history that cannot be read is said in one line and a SKIP, and the run is then not added
    to it (False): the verdict never waits on it, nor on a fault of the judging itself."""
    since = result.finished_at - timedelta(days=s.lemon_days)
    try:
        past = history.read(db, since=since, per_figure=(expect.recent + expect.earlier - 1) if expect else 0) or history.History([], [])
        result.history = history_judge.of_report(result, past, expect, s.lemon_fails, s.lemon_days)
    except history.HistoryError as e:
        console.error(f"history not kept: {e}; drift and lemons not judged, this run not added")
        result.history = reports.Result(check=history.CHECK, status=Status.SKIP, summary=f"history not kept: {e}")
        return False
    except Exception as e:  # a bug here must not cost the run its verdict, whose checks all ran
        console.error(f"history not judged: preflight broke judging it ({e!r}); this run not added")
        result.history = reports.Result(check=history.CHECK, status=Status.SKIP, summary=f"history not judged: {e!r}",
                                        details={"traceback": traceback.format_exc()})
        return False
    if result.history.status != Status.PASS:
        console.finish(result.history)
    return True


def begin(report: Path, started_at: datetime, deadline: datetime, console: Console) -> Path | None:
    """This run's record beside its report (run_record), or None where it cannot be
    written: said, and the run goes on (its report, once written, needs no record)."""
    path = run_record.path_for(report)
    try:
        # The report's own writer: one way to put a file where root writes.
        safefile.write_atomic(path, run_record.render(started_at, deadline, last_report.this_boot()))
    except OSError as e:
        console.error(f"could not record this run's start in {path}: {e.strerror or e}; should this run die before "
                      "its report is written, the last report would still stand")
        return None
    return path


def _tell_kept(kept: list[reports.Result], result: reports.Report, console: Console) -> None:
    """What this run's report holds that an earlier, deeper or fuller run measured."""
    now = datetime.now(timezone.utc)
    for when in dict.fromkeys(c.details["carried_from"] for c in kept):
        same = [c for c in kept if c.details["carried_from"] == when]
        if stood_in := [c for c in same if "interrupted" in c.details]:
            sig = signal_name(stood_in[0].details["interrupted"]["signal"])
            console.note(f"interrupted by {sig}: kept the results of the run of {when}{_age(when, now)} (level {same[0].details['carried_level']}) "
                         "for what this run did not finish: " + ", ".join(f"{c.check} {c.status}" for c in stood_in))
        if rest := [c for c in same if "interrupted" not in c.details]:
            console.note(f"kept from the run of {when} (this boot, level {same[0].details['carried_level']}): " + ", ".join(f"{c.check} {c.status}" for c in rest))
    for c in result.checks:
        if figures := c.details.get("carried_measurements"):
            console.note(f"{c.check}: kept the {figures['level']} run's {', '.join(figures['names'])} of {figures['from']}, which level {result.level} does not measure or judge")


def _age(when: object, now: datetime) -> str:
    try:
        return ", " + last_report.ago((now - datetime.fromisoformat(str(when))).total_seconds())
    except (TypeError, ValueError):
        return ""


def write(result: reports.Report, textfile: Path | None, report_path: Path | None, console: Console,
          record: Path | None = None, earlier_success: datetime | None = None, kept: Keep | None = None) -> None:
    """The textfile, then the report, each with the verdict the console prints last.

    The textfile is written first beside its name and put in place only once the
    report is on disk: a run killed between the two leaves the last run's textfile,
    never a PASS of a run whose report is missing. A file that cannot be written
    is left as it was, and the run vouches for nothing: a pass becomes an ERROR,
    exit 3 (a failure keeps its verdict and code), in what is written after it.
    So a textfile that cannot be written makes the report an ERROR; and a report
    that cannot be written turns the textfile into that ERROR (or, where even
    that fails, removes it). Once the report is written, the record of the run's
    start is removed: the report now speaks for that run. Then the run joins the node's
    history (``kept``), which may fail with one line and changes nothing written before it."""
    passed = result.verdict == reports.Verdict.PASS
    staged: list[safefile.Staged] = []
    if textfile is not None:
        _put("the metrics", textfile, lambda d: staged.append(metrics.stage_textfile(d, result)), result, console, earlier_success)
    if report_path is not None and not _put("the report", report_path, lambda p: safefile.write_atomic(p, result.model_dump_json(indent=2) + "\n"),
                                            result, console, earlier_success):
        for s in staged:
            s.discard()
        if staged and passed and textfile is not None:
            _take_back(textfile, result, console)
        return
    for s in staged:
        _put("the metrics", textfile, lambda _: s.commit(), result, console, earlier_success)  # type: ignore[arg-type]
    if record is not None and report_path is not None:
        _settle(record)
    if kept is not None:
        try:
            history.append(kept.path, result, kept.days, kept.runs)
        except history.HistoryError as e:
            console.error(f"history not kept: {e}; the report is written")
            return
        except Exception as e:  # the report is written: a bug in the history must not turn it into exit 3
            console.error(f"history not kept: preflight broke adding this run ({e!r}); the report is written")
            return
        try:
            trends.write(kept.path)  # for the page's readers, who cannot open history.db
        except (history.HistoryError, OSError) as e:
            console.error(f"the page's trends not written: {getattr(e, 'strerror', None) or e}; the report and history are")
        except Exception as e:
            console.error(f"the page's trends not written: preflight broke writing them ({e!r}); the report and history are")


def _put(what: str, path: Path, put: Callable[[Path], object], result: reports.Report, console: Console, earlier_success: datetime | None) -> bool:
    try:
        put(path)
        return True
    except OSError as e:
        console.error(f"could not write {what} to {path}: {e.strerror or e}; the previous file is unchanged")
        if result.verdict == reports.Verdict.PASS:
            result.verdict = reports.Verdict.ERROR  # what is written next must not vouch for a run that exits 3
            result.last_success_at = earlier_success
        result.exit_code = result.exit_code or reports.EXIT_CODES[reports.Verdict.ERROR]
        return False


def _take_back(textfile: Path, result: reports.Report, console: Console) -> None:
    """The report could not be written: the textfile says this run's ERROR rather than the last
    run's verdict, or, where even that cannot be written, nothing."""
    try:
        metrics.write_textfile(textfile, result)
    except OSError:
        path = textfile / metrics.TEXTFILE
        try:
            safefile.remove(path)  # frees space, never needs it; never through a planted link
            console.error(f"removed {path}: it said PASS of this run, whose report could not be written")
        except OSError as e:
            console.error(f"could not take back the PASS in {path}: {e.strerror or e}")


def _settle(record: Path) -> None:
    try:
        safefile.remove(record)  # never through a link another user planted on the way
    except OSError:
        pass  # left behind, it is still settled: the report started no earlier than its run (last_report.standing)
