"""The node's own past: every run appended to an SQLite database beside its report.

`preflight run --report DIR/report.json` appends its run to DIR/history.db once the
report is written (outputs/gate.py): the verdict, level, profile, times and action,
each check's status, and each figure it measured itself (a result or figure carried
from an earlier run is that run's, and is not counted twice). `preflight history`
reads it, and the next run judges drift and lemons from it (outputs/record/history_judge.py).

One transaction per run, in WAL mode: a reader sees the runs before or after a
write, never half of one, and reads while a run writes; a run killed mid-write
leaves the database as it was (SQLite's journal, synced before the commit).

Root writes here, so the rules of base/safefile.py hold, and more: SQLite opens the
database and creates its -wal and -shm files itself, by name, following links. So
the directory must be one only root (or this user) can change (a sticky /tmp is
not: another user could plant history.db-wal there), every one of those names
that exists must be a regular file no other user could have written, never a
link, and the database is created 0600 by us (O_EXCL|O_NOFOLLOW) before SQLite
opens it. Any trouble is a ``HistoryError`` with one line: the verdict never
waits on the history.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from preflight.base import pathtrust
from preflight.base.actions import Next, decide

if TYPE_CHECKING:
    from preflight.pipeline.report import Report

FILENAME = "history.db"
CHECK = "history"  # the run's own result about its history: never recorded as a figure
WAIT_SECONDS = 5.0  # a database another process holds locked longer is said and skipped
SCHEMA_VERSION = 1
_SIDE_FILES = ("-wal", "-shm", "-journal")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    verdict TEXT NOT NULL,
    level TEXT,
    profile TEXT,
    action TEXT,  -- what the run's checks asked (not its history's: a lemon is judged from these rows)
    domain TEXT,
    action_check TEXT,
    failed TEXT NOT NULL  -- the checks this run itself failed, comma-separated ('' for none)
);
CREATE INDEX IF NOT EXISTS runs_finished ON runs (finished_at);
CREATE TABLE IF NOT EXISTS results (
    run_id INTEGER NOT NULL,
    check_name TEXT NOT NULL,
    status TEXT NOT NULL,
    carried INTEGER NOT NULL,
    PRIMARY KEY (run_id, check_name)
) WITHOUT ROWID;
-- A figure is named once: its check, name, labels, unit and the floor it was judged by.
CREATE TABLE IF NOT EXISTS figures (
    id INTEGER PRIMARY KEY,
    check_name TEXT NOT NULL,
    name TEXT NOT NULL,
    labels TEXT NOT NULL,
    unit TEXT NOT NULL,
    floor REAL,
    ceiling REAL,
    UNIQUE (check_name, name, labels, unit, floor, ceiling)
);
-- By figure, then run: a figure's last readings are one seek (drift, --figure).
CREATE TABLE IF NOT EXISTS readings (
    figure_id INTEGER NOT NULL,
    run_id INTEGER NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (figure_id, run_id)
) WITHOUT ROWID;
"""


class HistoryError(Exception):
    """The history could not be read or written: one line, and the run goes on."""


@dataclass
class Run:
    id: int
    started_at: datetime
    finished_at: datetime
    verdict: str
    level: str | None
    profile: str | None
    action: str | None  # what its checks asked (checks_action)
    failed: list[str]
    statuses: dict[str, str] = field(default_factory=dict)
    domain: str | None = None  # its checks' action's: a lemon counts the node's failures alone


@dataclass
class Series:
    """One figure over the runs that measured it, oldest first: (run id, value)."""

    check: str
    name: str
    labels: dict[str, str]
    unit: str
    floor: float | None  # the latest run's
    ceiling: float | None
    points: list[tuple[int, float]] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.check, self.name, _labels(self.labels), self.unit)


@dataclass
class History:
    runs: list[Run]  # oldest first
    series: list[Series]


def path_for(report: Path) -> Path:
    return report.parent / FILENAME


def _labels(labels: dict[str, str]) -> str:
    return json.dumps(labels, sort_keys=True, separators=(",", ":"))


def _ts(t: datetime) -> float:
    return t.timestamp()


def _dt(x: float) -> datetime:
    return datetime.fromtimestamp(x, timezone.utc)


def failed_of(report: Report) -> list[str]:
    """The checks this run failed itself: a FAIL carried from an earlier run was counted there."""
    return [c.check for c in report.checks if c.status == "FAIL" and "carried_from" not in c.details and c.check != CHECK]


def figures_of(report: Report) -> list[tuple[str, str, str, str, float | None, float | None, float]]:
    """(check, name, labels, unit, floor, ceiling, value) of every figure this run measured itself.
    None of a run across nodes: its collectives are the group's, under the same names as this
    node's own, and would make the node's trends (and drift) of two different things."""
    out: list[tuple[str, str, str, str, float | None, float | None, float]] = []
    if report.group is not None:
        return out
    for c in report.checks:
        if c.check == CHECK or "carried_from" in c.details:
            continue
        kept = set((c.details.get("carried_measurements") or {}).get("names") or [])
        for m in c.measurements:
            if m.name not in kept:
                out.append((c.check, m.name, _labels(m.labels), m.unit, m.floor, m.ceiling, m.value))
    return out


def _trusted(path: Path, create: bool) -> str | None:
    """The database's path for SQLite once proven (see the module's docstring); None where
    there is none and ``create`` is false. Raises HistoryError."""
    mine = (0, os.geteuid())
    try:
        with pathtrust.locate(path, follow_last=False) as place:  # a link at the name is refused, never followed
            d = os.fstat(place.dir_fd)
            if d.st_uid not in mine or d.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                who = f"is {pathtrust.owner(d.st_uid)}'s" if d.st_uid not in mine else "can be written by other users"
                raise HistoryError(f"{place.directory} {who}, and SQLite opens {place.name} and its -wal file by name there: "
                                   "keep the report in a directory only root can change")
            # SQLite opens the path again by name, so every directory above must be as safe: one
            # another user can rename (theirs, or writable and not sticky) lets them swap in a tree
            # of their own between this check and the open, and steer root's writes.
            if why := pathtrust.steerable(place.directory):
                raise HistoryError(f"{why}, and SQLite opens {place.directory / place.name} by name: another user could swap a "
                                   "directory on the way; keep the report in a directory only root can change")
            for name in (place.name, *(place.name + s for s in _SIDE_FILES)):
                try:
                    st = os.stat(name, dir_fd=place.dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    raise HistoryError(f"{place.directory / name} is a symlink; preflight opens no database through one")
                if not stat.S_ISREG(st.st_mode):
                    raise HistoryError(f"{place.directory / name} is not a regular file")
                if st.st_uid not in mine or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    who = f"is {pathtrust.owner(st.st_uid)}'s" if st.st_uid not in mine else "is writable by other users"
                    raise HistoryError(f"{place.directory / name} {who}: another user could have written it; move it aside")
            if place.st is None:
                if not create:
                    return None
                fd = os.open(place.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=place.dir_fd)
                os.fchmod(fd, 0o600)  # the umask does not choose it
                os.close(fd)
            return str(place.directory / place.name)
    except HistoryError:
        raise
    except OSError as e:
        raise HistoryError(f"{path}: {e.strerror or e}") from None


def _connect(db: str, readonly: bool) -> sqlite3.Connection:
    mode = "ro" if readonly else "rw"  # never "rwc": the file was made (0600) and proven by _trusted
    con = sqlite3.connect(f"file:{quote(db)}?mode={mode}", uri=True, timeout=WAIT_SECONDS, isolation_level=None)
    con.execute(f"PRAGMA busy_timeout = {int(WAIT_SECONDS * 1000)}")
    return con


def _said(e: BaseException, db: Path) -> HistoryError:
    text = str(e)
    if "locked" in text or "busy" in text:
        text = f"locked by another process for over {WAIT_SECONDS:g} s"
    elif "not a database" in text or "malformed" in text:
        text = f"{text}: move it aside (it is kept as it is) and the next run starts a new one"
    return HistoryError(f"{db}: {text}")


def append(path: Path, report: Report, keep_days: float, keep_runs: int) -> int:
    """Add ``report``'s run to the history at ``path`` in one transaction, then drop runs
    older than ``keep_days`` or past the newest ``keep_runs``. Returns the run's id."""
    db = _trusted(path, create=True)
    assert db is not None
    try:
        con = _connect(db, readonly=False)
        try:
            if con.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
                raise HistoryError(f"{path}: SQLite would not use WAL mode here")
            # FULL: each commit is synced, so a power cut keeps the run the report already says.
            con.execute("PRAGMA synchronous = FULL")
            con.execute("BEGIN IMMEDIATE")
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise HistoryError(f"{path}: written by a newer preflight (schema {version}); left as it is")
            # One statement at a time: executescript would commit the transaction first.
            for statement in filter(str.strip, _SCHEMA.split(";")):
                con.execute(statement)
            con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            run_id = _insert(con, report)
            # Aged from the history's own timeline: a boot whose clock is ahead until NTP sets it
            # must not age out every run before it.
            newest_before = con.execute("SELECT max(finished_at) FROM runs WHERE id < ?", (run_id,)).fetchone()[0]
            now = _ts(report.finished_at) if newest_before is None else min(_ts(report.finished_at), newest_before + 86400)
            cutoff = now - keep_days * 86400
            con.execute("DELETE FROM runs WHERE finished_at < ? OR id <= (SELECT id FROM runs ORDER BY id DESC LIMIT 1 OFFSET ?)", (cutoff, keep_runs))
            oldest = con.execute("SELECT min(id) FROM runs").fetchone()[0]
            con.execute("DELETE FROM results WHERE run_id < ?", (oldest,))
            for (figure_id,) in con.execute("SELECT id FROM figures").fetchall():
                con.execute("DELETE FROM readings WHERE figure_id = ? AND run_id < ?", (figure_id, oldest))
            con.execute("DELETE FROM figures WHERE NOT EXISTS (SELECT 1 FROM readings WHERE figure_id = figures.id)")
            con.execute("COMMIT")
            return run_id
        finally:
            con.close()
    except sqlite3.Error as e:
        raise _said(e, path) from None


def checks_action(r: Report) -> tuple[Next, str | None]:
    """What the run's checks asked, without its history's result: a lemon's `service` is a
    judgement over these rows, and stored as a run's own it would count the job's faults of
    every later run toward the next lemon (history_judge.lemon)."""
    return decide([(c.next, c.check) for c in r.checks])


def _insert(con: sqlite3.Connection, r: Report) -> int:
    asked, check = checks_action(r)
    cur = con.execute(
        "INSERT INTO runs (started_at, finished_at, verdict, level, profile, action, domain, action_check, failed) VALUES (?,?,?,?,?,?,?,?,?)",
        (_ts(r.started_at), _ts(r.finished_at), str(r.verdict.value), r.level, r.profile, str(asked.action), str(asked.domain), check, ",".join(failed_of(r))))
    run_id = int(cur.lastrowid or 0)
    con.executemany("INSERT OR REPLACE INTO results (run_id, check_name, status, carried) VALUES (?,?,?,?)",
                    [(run_id, c.check, str(c.status), int("carried_from" in c.details)) for c in r.checks])
    for check, name, labels, unit, floor, ceiling, value in figures_of(r):
        key = (check, name, labels, unit, floor, ceiling)
        row = con.execute("SELECT id FROM figures WHERE check_name=? AND name=? AND labels=? AND unit=? AND floor IS ? AND ceiling IS ?", key).fetchone()
        figure_id = row[0] if row else con.execute("INSERT INTO figures (check_name, name, labels, unit, floor, ceiling) VALUES (?,?,?,?,?,?)", key).lastrowid
        con.execute("INSERT OR REPLACE INTO readings (figure_id, run_id, value) VALUES (?,?,?)", (figure_id, run_id, value))
    return run_id


def read(path: Path, since: datetime | None = None, last: int | None = None, check: str | None = None,
         figure: str | None = None, per_figure: int | None = None, writer: bool = False) -> History | None:
    """The runs finished at or after ``since`` and the ``last`` runs (either, or all where
    both are None), oldest first, with the figures they measured (of ``check``, named
    ``figure``, where given). With ``per_figure``, each figure's last that many readings
    instead, whichever runs they were in (a lighter run between measures fewer figures), and
    those runs too. None where there is no history yet. Raises HistoryError. ``writer``: the run
    that just wrote it reads it back (trends.py): a read-write connection, whose close folds the
    WAL back and removes it and the -shm, as a read-only one cannot."""
    db = _trusted(path, create=False)
    if db is None:
        return None
    try:
        con = _connect(db, readonly=not writer)
        try:
            con.execute("BEGIN")  # one snapshot: a run committed meanwhile is not half read
            if not con.execute("SELECT 1 FROM sqlite_master WHERE name='runs'").fetchone():
                return History([], [])
            where, args = _which(since, last)
            picked = [row[0] for row in con.execute(f"SELECT id FROM runs WHERE {where}", args)]
            first = min(picked, default=None)
            query, params = "SELECT id, check_name, name, labels, unit, floor, ceiling FROM figures WHERE 1", []
            for column, value in (("check_name", check), ("name", figure)):
                if value is not None:
                    query, params = query + f" AND {column} = ?", [*params, value]
            series: dict[tuple[str, str, str, str], Series] = {}
            for figure_id, c, n, labels, unit, floor, ceiling in con.execute(query + " ORDER BY id", params).fetchall():
                if per_figure is not None:
                    rows = con.execute("SELECT run_id, value FROM readings WHERE figure_id = ? ORDER BY run_id DESC LIMIT ?", (figure_id, per_figure)).fetchall()[::-1]
                elif first is None:
                    continue
                else:
                    rows = con.execute("SELECT run_id, value FROM readings WHERE figure_id = ? AND run_id >= ?", (figure_id, first)).fetchall()
                if not rows:
                    continue
                s = series.setdefault((c, n, labels, unit), Series(c, n, json.loads(labels), unit, floor, ceiling))
                s.floor, s.ceiling = floor, ceiling  # figures go by id: the last one is the latest floor
                s.points.extend(rows)
            wanted = set(picked) | {run_id for s in series.values() for run_id, _ in s.points}
            for s in series.values():
                s.points.sort()
                if per_figure is not None:
                    del s.points[:-per_figure]
            low = min(wanted, default=0)
            runs = [Run(i, _dt(st), _dt(f), v, lv, p, a, [x for x in fl.split(",") if x], domain=dm)
                    for i, st, f, v, lv, p, a, fl, dm in con.execute(
                        "SELECT id, started_at, finished_at, verdict, level, profile, action, failed, domain FROM runs WHERE id >= ? ORDER BY id", (low,))
                    if i in wanted]
            by_id = {r.id: r for r in runs}
            for run_id, name, status in con.execute("SELECT run_id, check_name, status FROM results WHERE run_id >= ?", (low,)):
                if run_id in by_id:
                    by_id[run_id].statuses[name] = status
            con.execute("COMMIT")
            return History(runs, sorted((s for s in series.values() if s.points), key=lambda s: s.key))
        finally:
            con.close()
    except sqlite3.Error as e:
        raise _said(e, path) from None
    except (ValueError, TypeError) as e:  # a row no preflight wrote
        raise HistoryError(f"{path}: unreadable row ({e})") from None


def _which(since: datetime | None, last: int | None) -> tuple[str, tuple[object, ...]]:
    parts, args = [], []
    if since is not None:
        parts.append("finished_at >= ?")
        args.append(_ts(since))
    if last is not None:
        parts.append("id IN (SELECT id FROM runs ORDER BY id DESC LIMIT ?)")
        args.append(last)
    return (" OR ".join(parts) or "1", tuple(args))
