"""`preflight run` once its settings are read: the plan run under the lock, and
its verdict left where machines read it (the textfile, then the report).

Both paths are refused before a check runs; a file that cannot be written
afterwards is left as it was, and a run that passed exits 3. Neither is ever
written through a link another user could have planted (base/safefile.py).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from preflight.base import safefile
from preflight.base.signals import interrupting
from preflight.outputs import metrics
from preflight.pipeline import plan as pipeline, report as reports
from preflight.pipeline.lock import LockHeld, run_lock

if TYPE_CHECKING:
    from preflight.outputs.console import Console
    from preflight.pipeline.settings import Settings


def run(s: Settings, console: Console, if_idle: bool = False, if_locked: str = "error") -> reports.Report | None:
    """The run's report, written; None when nothing ran and the last report stands:
    ``if_idle`` found a GPU held, or with ``if_locked="skip"`` another run still held
    the lock after ``s.lock_timeout``. Raises UsageError before any check for bad input."""
    report_path = safefile.check(s.report, f"report {s.report}") if s.report is not None else None
    textfile = metrics.check_textfile_dir(s.textfile_dir) if s.textfile_dir is not None else None
    with interrupting():  # the runner stops the running check's workers and still writes the report
        the_plan = pipeline.plan(s)  # may ask NVML (bounded), so it runs under the handlers too
        if if_idle and (held := pipeline.gpus_busy(s)):
            console.note(f"not run: {held}; the last report stands")
            return None
        with ExitStack() as locked:
            try:
                locked.enter_context(run_lock(s.lock_file, s.lock_timeout, lambda who: console.note(f"waiting for {who} to release {s.lock_file}")))
            except LockHeld as e:
                if if_locked != "skip":
                    raise
                # Said even with -q: this run judged nothing, and whoever reads its output must know.
                console.line(f"preflight: not run: another preflight run ({e.holder}) still holds {s.lock_file} after {s.lock_timeout:g} s; "
                             "the last report stands, and that run writes its own verdict")
                return None
            result = pipeline.execute(the_plan, s, console)
            result.level, result.level_chosen_because = the_plan.level, the_plan.level_chosen_because
            before = reports.read_previous(report_path)
            kept = reports.carry_forward(result, before, the_plan.profile.checks if the_plan.profile else [], across_nodes=the_plan.group is not None)
            _tell_kept(kept, result, console)
            result.last_success_at = reports.last_success(result, before) or (metrics.previous_success(textfile) if textfile else None)
            write(result, textfile, report_path, console)
    return result


def _tell_kept(kept: list[reports.Result], result: reports.Report, console: Console) -> None:
    """What this run's report holds that an earlier, deeper or fuller run measured."""
    for when in dict.fromkeys(c.details["carried_from"] for c in kept):
        same = [c for c in kept if c.details["carried_from"] == when]
        console.note(f"kept from the run of {when} (this boot, level {same[0].details['carried_level']}): " + ", ".join(f"{c.check} {c.status}" for c in same))
    for c in result.checks:
        if figures := c.details.get("carried_measurements"):
            console.note(f"{c.check}: kept the {figures['level']} run's {', '.join(figures['names'])} of {figures['from']}, which level {result.level} does not measure or judge")


def write(result: reports.Report, textfile: Path | None, report_path: Path | None, console: Console) -> None:
    """The textfile first: if it cannot be written the run is an ERROR, and the
    report then says so too, so the gate and every reader of the report agree."""
    for what, path, put in (
        ("the metrics", textfile, lambda d: metrics.write_textfile(d, result)),
        ("the report", report_path, lambda p: safefile.write_atomic(p, result.model_dump_json(indent=2) + "\n")),
    ):
        if path is None:
            continue
        try:
            put(path)
        except OSError as e:
            # The verdict still stands and is printed; a failed gate stays failed, a pass exits 3.
            console.error(f"could not write {what} to {path}: {e.strerror or e}; the previous file is unchanged")
            result.exit_code = result.exit_code or reports.EXIT_CODES[reports.Verdict.ERROR]
            if path is textfile and result.verdict == reports.Verdict.PASS:
                result.verdict = reports.Verdict.ERROR  # the report written next must not vouch for a run that exits 3
