"""The node's trends where the page's readers can read them: trends.json beside the report.

history.db stays 0600 (outputs/record/history.py: any user who can open an SQLite file can hold
its locks and stall every run's history), so serve, which runs as an unprivileged
DynamicUser, cannot read it. So each run that joins the history then writes its last
``RUNS`` runs here, 0644 and atomically as the report is written, in the form
`preflight history --json` prints; the page (serve's `/` and `report --html`) draws its
trends from this file, and from history.db only where no file was written yet (a
history kept before this file existed).

The file is root's, in the report's directory: it is read only if no other user could
have written it or put it there (base/safefile.read_own), as a run reads its own past.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

from preflight.base import safefile
from preflight.outputs.record import history, history_text
from preflight.outputs.record.history import History, Run, Series

FILENAME = "trends.json"
RUNS = 30  # the page's span: a month of daily runs, a day of hourly rechecks
MAX_BYTES = 16 << 20


def path_for(report: Path) -> Path:
    return report.parent / FILENAME


def write(db: Path) -> None:
    """The last RUNS runs of the history at ``db`` into trends.json beside it. Raises
    HistoryError (the history) or OSError (the file); the old file is then left as it was."""
    h = history.read(db, last=RUNS, writer=True) or History([], [])
    safefile.write_atomic(db.parent / FILENAME, history_text.as_json(h, str(db)), 0o644)


def identity(report: Path) -> tuple[int, int, int] | None:
    """What changes when the file is rewritten (serve renders its page again then), or None."""
    try:
        st = os.stat(path_for(report), follow_symlinks=False)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def read(report: Path) -> History | None:
    """The trends written beside ``report``; None where there is no such file. Raises
    HistoryError for one another user could have written, or one no run wrote."""
    path = path_for(report)
    data = safefile.read_own(path, MAX_BYTES + 1)
    if data is None:
        if not os.path.lexists(path):
            return None
        raise history.HistoryError(f"{path} could have been written by another user, or is not a regular file this user may read: not read")
    if len(data) > MAX_BYTES:
        raise history.HistoryError(f"{path} is over {MAX_BYTES >> 20} MiB: no run wrote it")
    try:
        return from_json(json.loads(data))
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, RecursionError) as e:
        raise history.HistoryError(f"{path} is not what a run writes ({e!r}): the next run writes it again") from None


def from_json(doc: dict) -> History:
    """The inverse of history_text.as_json."""
    runs = [Run(int(r["id"]), datetime.fromisoformat(r["started_at"]), datetime.fromisoformat(r["finished_at"]), str(r["verdict"]),
                r["level"], r["profile"], r["action"], [str(c) for c in r["failed"]], {str(k): str(v) for k, v in r["checks"].items()},
                r.get("domain"))
            for r in doc["runs"]]
    series = [Series(str(f["check"]), str(f["name"]), {str(k): str(v) for k, v in f["labels"].items()}, str(f["unit"]),
                     None if f["floor"] is None else float(f["floor"]), None if f["ceiling"] is None else float(f["ceiling"]),
                     [(int(v["run"]), float(v["value"])) for v in f["values"]])
              for f in doc["figures"]]
    if any(not s.points for s in series):
        raise ValueError("a figure with no values")
    return History(runs, series)


def for_page(report: Path) -> tuple[History | None, str]:
    """The trends for ``report``'s page, or why there are none to draw: trends.json, else
    history.db (a history from before the file; root's only)."""
    try:
        h = read(report)
        if h is not None:
            return h, ""
    except history.HistoryError as e:
        return None, f"trends not read: {e}"
    try:
        return history.read(history.path_for(report), last=RUNS), ""
    except history.HistoryError as e:
        return None, f"history not read: {e}"
