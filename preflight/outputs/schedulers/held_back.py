"""What a scheduler integration held back, said in the node's own report.

slurm-healthcheck past its cap on drains (outputs/schedulers/slurm_cap.py) leaves a failing node
in service: the report that asked for the drain then says so (``Report.held_back``),
where `status`, the page and the metrics read it, beside the tool's own output and
textfile. The run that writes the next report writes none: the tool says it again
if it holds back again.

The report is the run's: this rewrites it only under the run lock, taken without
waiting (a run under way writes a new report, and the next health check speaks to
that one), and only the report the tool judged (the same ``started_at``). It is
written as a run writes it (base/safefile.py: atomically, never through a link).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from preflight.base import safefile
from preflight.base.errors import UsageError
from preflight.pipeline.lock import LockHeld, run_lock
from preflight.pipeline.report import HeldBack, Report


def record(report: Path, judged: datetime, said: str | None, by: str, lock_file: Path) -> str | None:
    """Write ``said`` (or clear what ``by`` said, with None) into the report at ``report``
    that started at ``judged``. None where done or nothing was to change; else why not, one line."""
    try:
        with run_lock(lock_file, 0):
            raw = safefile.read_own(report)
            if raw is None:
                return f"{report}: not a report of this user's to write into"
            try:
                r = Report.model_validate_json(raw)
            except ValidationError:
                return f"{report}: not a report preflight wrote"
            if r.started_at != judged:
                return f"{report}: a newer run's report since; the next health check speaks to it"
            now = r.held_back
            if said is None:
                if now is None or now.by != by:
                    return None
                r.held_back = None
            elif now is not None and (now.by, now.said) == (by, said):
                return None  # said already: the file is not rewritten at every health check
            else:
                r.held_back = HeldBack(by=by, said=said, at=datetime.now(timezone.utc))
            safefile.write_atomic(report, r.model_dump_json(indent=2) + "\n")
            return None
    except LockHeld:
        return f"{report}: another preflight holds {lock_file} (a run writing a new report, or another health check); the next health check speaks to it"
    except UsageError as e:  # a lock file run would refuse too: said, and the health check's exit stands
        return str(e)
    except OSError as e:
        return f"{report}: {e.strerror or e}"
