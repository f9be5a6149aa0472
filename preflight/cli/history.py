"""`preflight history`: the node's own past, as the runs beside its report left it."""

# No `from __future__ import annotations`: see preflight/cli/common.py.
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from preflight.cli.common import ConfigOpt, JsonOpt, _emit, _exit_codes, _settings

DEFAULT_LAST = 30  # runs shown when --since does not say: a terminal's worth of timeline


@_exit_codes
def history(
    report: Annotated[Optional[Path], typer.Option("--report", metavar="FILE", help="The report whose history.db (beside it) to read. [default: the settings' report, else the one `run` writes by default: /var/lib/preflight/report.json as root, else $XDG_STATE_HOME/preflight/report.json (~/.local/state/...)]")] = None,
    check: Annotated[Optional[str], typer.Option("--check", metavar="CHECK", help="Only this check's figures.")] = None,
    figure: Annotated[Optional[str], typer.Option("--figure", metavar="NAME", help="Only figures of this name (memcpy_bandwidth, gemm_throughput, ...).")] = None,
    since: Annotated[Optional[str], typer.Option("--since", metavar="WHEN", help=f"Runs since then: 7d, 24h, 90m ago, or a date or time (UTC). [default: the last {DEFAULT_LAST} runs]")] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> int:
    """The verdict timeline and each figure's trend (a sparkline a figure; the values in --json), from the
    history every `preflight run` that writes a report adds to. Never runs a check. Exit 0, 2 for a history it cannot read."""
    from preflight.base.errors import UsageError
    from preflight.outputs.record import history as store, history_text
    from preflight.pipeline.report_paths import default_report_path, reader_report_path

    db = store.path_for(report or _settings(config).report or reader_report_path())
    start = history_text.parse_since(since) if since is not None else None
    try:
        h = store.read(db, since=start, last=None if start else DEFAULT_LAST, check=check, figure=figure)
    except store.HistoryError as e:
        # The node's history is root's alone (0600: outputs/record/history.py); its trends are not.
        alone = f"; the node's history is root's alone: run it as root, or read {db.parent / 'trends.json'}" if os.geteuid() != 0 and not os.access(db, os.R_OK) else ""
        raise UsageError(f"history: {e}{alone}") from None
    if h is None:
        h = store.History([], [])
        if not json_out:
            how = "preflight run" if db.parent == default_report_path().parent else f"preflight run --report {db.parent / 'report.json'}"
            _emit(f"no history at {db}: `{how}` starts it\n")
            return 0
    _emit(history_text.as_json(h, str(db)) if json_out else "\n".join(history_text.text(h, str(db))) + "\n")
    return 0
