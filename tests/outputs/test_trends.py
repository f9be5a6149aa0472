"""trends.json: the page's trends where an unprivileged reader (serve's DynamicUser) can read them,
while history.db stays root's alone. Written by real `preflight run`s; read as user nobody by a
forked process that dropped root, so the code read is this checkout's."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import as_user, clean_env, recorded_run, run_preflight, shared  # noqa: F401 (shared: a fixture)
from test_serve import get, serving

from preflight.base import safefile
from preflight.outputs.record import history, history_text, trends
from preflight.pipeline.report import Report

NOBODY = 65534


def run(d: Path, *args: str):
    env = {**clean_env(), "PREFLIGHT_LOCK_FILE": str(d / "preflight.lock")}
    return run_preflight(["run", "--profile", "cpu", "--only", "shm", "-q", "--report", str(d / "report.json"), *args], env=env, timeout=200)


def test_a_run_writes_the_last_runs_beside_its_report_and_a_reader_without_root_draws_them(shared):
    for hours_ago in (40, 30, 20):
        history.append(shared / "history.db", recorded_run(hours_ago), 90, 10000)
    os.chmod(shared / "history.db", 0o600)
    p = run(shared)
    assert p.returncode == 0, p.stderr
    st = os.stat(shared / "trends.json")
    assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(os.stat(shared / "history.db").st_mode) == 0o600  # the database stays root's alone
    written = trends.read(shared / "report.json")
    kept = history.read(shared / "history.db", last=trends.RUNS)
    assert written == kept and len(written.runs) == 4 and written.runs[-1].statuses == {"shm": "PASS"}
    assert any(s.check == "shm" for s in written.series)

    def page() -> dict:
        h, said = trends.for_page(shared / "report.json")
        try:
            history.read(shared / "history.db")
            db = "read"
        except history.HistoryError as e:
            db = str(e)
        return {"runs": len(h.runs) if h else None, "said": said, "db": db}

    seen = as_user(NOBODY, page)
    assert seen["runs"] == 4 and seen["said"] == "", seen  # the trends, though history.db is closed to this user
    assert "unable to open" in seen["db"], seen


def test_serve_draws_the_trends_from_the_file_and_again_when_only_the_file_changes(shared):
    assert run(shared).returncode == 0
    for name in ("history.db", "history.db-wal", "history.db-shm"):
        (shared / name).unlink(missing_ok=True)  # the page can only have them from trends.json now
    with serving(shared / "report.json") as (url, _):
        assert "<h2>Trends over the last run</h2>" in get(url + "/")[2]
        h = trends.read(shared / "report.json")
        again = history.History([h.runs[0], replace(h.runs[0], id=2)], [replace(s, points=[*s.points, (2, s.points[0][1])]) for s in h.series])
        safefile.write_atomic(shared / "trends.json", history_text.as_json(again, "history.db"), 0o644)  # the report is unchanged
        assert "<h2>Trends over the last 2 runs</h2>" in get(url + "/")[2]


def test_without_trends_json_the_page_reads_history_db_as_before(shared):
    for hours_ago in (3, 2, 1):
        history.append(shared / "history.db", recorded_run(hours_ago), 90, 10000)
    h, said = trends.for_page(shared / "report.json")
    assert said == "" and h is not None and len(h.runs) == 3


@pytest.mark.parametrize("content, words", [
    (b"{not json", "is not what a run writes"),
    (b'{"runs": [{"id": 1}], "figures": []}', "is not what a run writes"),
    (b'{"runs": [], "figures": [{"check": "c", "name": "n", "labels": {}, "unit": "s", "floor": null, "ceiling": null, "values": []}]}',
     "is not what a run writes"),
    (b"[" * 100000 + b"]" * 100000, "is not what a run writes"),
])
def test_a_damaged_trends_file_is_one_line_on_the_page(shared, content, words):
    (shared / "trends.json").write_bytes(content)
    h, said = trends.for_page(shared / "report.json")
    assert h is None and said.startswith(f"trends not read: {shared / 'trends.json'} {words}") and "\n" not in said


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to user nobody")
def test_a_trends_file_another_user_could_have_written_is_not_drawn(shared):
    (shared / "trends.json").write_text(json.dumps({"runs": [], "figures": []}))
    os.chown(shared / "trends.json", NOBODY, NOBODY)
    h, said = trends.for_page(shared / "report.json")
    assert h is None and said == f"trends not read: {shared / 'trends.json'} could have been written by another user, or is not a regular file this user may read: not read"


def test_trends_that_cannot_be_written_are_said_in_one_line_and_change_no_verdict(shared):
    (shared / "trends.json").mkdir()
    p = run(shared)
    assert p.returncode == 0 and Report.model_validate_json((shared / "report.json").read_text()).verdict == "pass"
    assert "the page's trends not written: " in p.stderr and "the report and history are" in p.stderr, p.stderr
    assert len(history.read(shared / "history.db").runs) == 1


@pytest.mark.parametrize("since", ["1000000d", "100000000h", "99999999999d"])
def test_a_span_further_back_than_a_date_goes_is_one_line(since):
    from preflight.base.errors import UsageError
    from preflight.outputs.record import history_text

    with pytest.raises(UsageError, match=f"^--since '{since}': further back than a date can go; give a span of years at most"):
        history_text.parse_since(since)
    assert history_text.parse_since("3650d").year >= 2010
