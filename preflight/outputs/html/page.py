"""`preflight report --html` and serve's `/`: the report as one page a person
takes in at a glance.

The page is one self-contained file: inline CSS and SVG, no script, no font,
no image or style from anywhere else, and a Content-Security-Policy that
forbids loading any, so it opens the same on an air-gapped node, from a mail
attachment or behind serve. The order is the order of questions: is the node
good (the banner, each problem with its cause and fix), where did the time
go, which GPU is weakest, how do the GPUs talk (P2P, layout), did training
and the burn-in behave, and, for a group, which node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from preflight.base.errors import signal_name
from preflight.outputs.html import page_facts as facts
from preflight.outputs.html import page_layout, page_svg, page_traces
from preflight.outputs.html.page_svg import COLOURS, esc, fmt

if TYPE_CHECKING:
    from preflight.outputs.record.history import History
    from preflight.outputs.record.last_report import Standing
    from preflight.pipeline.report import Report

# No script, no network: what a browser may load for this page is nothing but itself.
POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
STYLE = """
body{font:14px/1.45 sans-serif;margin:0;color:#212121;background:#fff}
main{max-width:1100px;margin:0 auto;padding:0 16px 40px}
header.banner{color:#fff;padding:18px 24px;margin:0 0 12px}
header.banner h1{margin:0;font-size:28px} header.banner p{margin:4px 0 0}
.pass{background:#2e7d32}.fail{background:#c62828}.error{background:#6a1b9a}.interrupted{background:#a15c00}.unvouched{background:#546e7a}
section{margin:22px 0} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 4px}
.problem{border-left:6px solid #c62828;background:#fff5f5;padding:8px 12px;margin:8px 0}
.problem.WARN{border-color:#ef8f00;background:#fffaf0}.problem.ERROR{border-color:#6a1b9a;background:#f8f0ff}.problem.INTERRUPTED{border-color:#a15c00;background:#fff8ee}
.problem b{font-family:monospace} .muted{color:#666} code{background:#f1f1f1;padding:0 3px}
table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
td.time{white-space:nowrap}
.st{font-weight:bold;font-family:monospace}
.scroll{overflow-x:auto}
"""
STATUS_CLASS = {"PASS": "PASS", "WARN": "WARN", "FAIL": "FAIL", "ERROR": "ERROR", "SKIP": "SKIP"}


def render(report: Report, source: str, standing: Standing | None = None, trends: History | None = None, trends_said: str = "") -> str:
    """The whole page for ``report``; ``source`` says where the report was read; ``standing``
    (serve's) what the report vouches for now, where that is no longer its verdict; ``trends``
    the node's history beside the report (outputs/record/history.py), or ``trends_said`` why there is none."""
    parts = [_banner(report, source, standing), _problems(report), _checks(report), _figures(report), _trends(trends, trends_said),
             _p2p(report), _layout(report), _traces(report), _group(report)]
    title = f"preflight {report.verdict.value.upper()}: {report.hostname}"
    return _document(title, "".join(p for p in parts if p) + "</main>")


def unavailable(state: str, error: str | None) -> str:
    """serve's `/` when there is no report it can show: why, in the page's own form."""
    body = (f'<header class="banner error"><h1>No report to show ({esc(state)})</h1>'
            f'<p>{esc(error or "")}</p></header><main><p>Run <code>preflight run --report PATH</code> '
            "with the path serve reads; <a href=\"/healthz\">/healthz</a> says the report's state.</p></main>")
    return _document(f"preflight: report {state}", body)


def _document(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{POLICY}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{STYLE}</style></head><body>{body}</body></html>\n")


def _banner(r: Report, source: str, standing: Standing | None = None) -> str:
    verdict = r.verdict.value
    said = {"pass": "this node is fit for the job", "fail": "a check failed: drain this node", "error": "preflight itself broke: the node is not vouched for"}
    kind, head, line = verdict, verdict.upper(), said[verdict]
    if r.interrupted_by_signal:  # stopped, not broken
        sig = signal_name(r.interrupted_by_signal)
        if verdict == "error":
            kind, head = "interrupted", "INTERRUPTED"
            line = (f"the run was interrupted by {sig} before it finished: the node is not vouched for; "
                    "what it did not finish keeps the last complete results, each marked with the run that measured it")
        else:
            line += f"; the run was then interrupted by {sig}"
    if standing is not None and not standing.vouched and verdict == "pass":
        kind, head, line = "unvouched", "NOT VOUCHED", f"not vouched now: {standing.reason}; this report passed"
    if str(r.action) != "none":  # what a fleet's automation acts on, in the words it reads (the JSON's action)
        line += f"; action: {r.action} ({r.domain}, from {r.action_check}: {r.action_source})"
    if r.held_back is not None:
        line += f"; held back by {r.held_back.by} at {r.held_back.at.isoformat(timespec='seconds')}: {r.held_back.said}"
    bits = [f"profile {r.profile or 'none'}", f"level {r.level or 'standard'}", f"finished {r.finished_at.isoformat(timespec='seconds')}",
            f"{r.duration_seconds:.1f} s", f"preflight {r.version}"]
    bits += [f"{k} {v}" for k, v in sorted(r.versions.items())]
    if r.shape is not None:
        bits.append(r.shape.describe())
    if r.interrupted_by_signal:
        bits.append(f"interrupted by {signal_name(r.interrupted_by_signal)}")
    return (f'<header class="banner {kind}" data-verdict="{verdict}"><h1>{esc(head)}: {esc(r.hostname)}</h1>'
            f"<p>{esc(line)}</p><p>{esc(' | '.join(bits))}</p><p class=\"src\">{esc(source)}</p></header><main>")


def _problems(r: Report) -> str:
    found = [p for p in (facts.interruption(r), *facts.problems(r)) if p is not None]
    if not found:
        return "<section><h2>Problems</h2><p>None: every check that ran passed.</p></section>"
    items = []
    for p in found:
        items.append(f'<div class="problem {p.status}" data-check="{esc(p.check)}"><b>{esc(p.check)} {esc(p.status)}</b>: {esc(p.summary)}'
                     + (f" <i>(measured by {esc(p.carried)}, carried into this report)</i>" if p.carried else "")
                     + (f"<br><span class=\"muted\">cause:</span> {esc(p.cause)}" if p.cause else "")
                     + (f"<br><span class=\"muted\">fix:</span> {esc(p.remedy)}" if p.remedy else "")
                     + (f"<br><span class=\"muted\">action:</span> {esc(p.action)}" if p.action else "") + "</div>")
    return "<section><h2>Problems</h2>" + "".join(items) + "</section>"


def _checks(r: Report) -> str:
    rows = []
    for c in r.checks:
        when = facts.carried(c)
        rows.append(f'<tr><td>{esc(c.check)}</td><td class="st" style="color:{COLOURS.get(c.status.value, "#000")}">{esc(c.status.value)}</td>'
                    f"<td class=\"time\">{'carried' if when else f'{c.duration_seconds:.2f} s'}</td>"
                    f"<td>{esc(c.summary)}{f' <i>(measured by {esc(when)})</i>' if when else ''}"
                    f"{f' <i>(this run: {esc(cut)})</i>' if (cut := (c.details.get('interrupted') or {}).get('summary')) else ''}</td></tr>")
    spans = facts.timeline(r)
    return ("<section><h2>Checks, and where the time went</h2>"
            f'<div class="scroll">{page_svg.timeline(spans, r.duration_seconds)}</div>'
            f'<p class="muted">The run took {r.duration_seconds:.1f} s; the checks {sum(s.seconds for s in spans):.1f} s of it '
            "(the rest: planning, reading the node, writing the verdict).</p>"
            f"<table><tr><th>check</th><th>status</th><th>time</th><th>summary</th></tr>{''.join(rows)}</table></section>")


def _figures(r: Report) -> str:
    groups = facts.bar_groups(r)
    if not groups:
        return "<section><h2>Per-GPU figures</h2><p>No per-GPU or per-rank figure held to a floor in this report.</p></section>"
    out = ["<section><h2>Per-GPU figures against their floors</h2>"
           '<p class="muted">Weakest first. The dashed line is the floor (or ceiling); red is past it; an orange or red ring '
           "is an outlier against the node's own median, WARN or FAIL as the check judged it (after a second reading where it took one).</p>"]
    for g in groups:
        title = g.name.replace("_", " ") + (f" ({g.variant})" if g.variant else "") + (f", measured by {g.carried}" if g.carried else "")
        out.append(f'<h3>{esc(g.check)}: {esc(title)}</h3><div class="scroll">{page_svg.bars(g)}</div>')
    return "".join(out) + "</section>"


def _trends(h: History | None, said: str) -> str:
    """Each figure over the runs the history holds, a sparkline scaled to its own range, its first
    and last value and its floor; the drift itself, where there is one, is among the problems."""
    from preflight.outputs.record.history_text import sparkline
    from preflight.base.units import fmt_value

    if h is None or not h.series:
        return f"<section><h2>Trends</h2><p>{esc(said)}</p></section>" if said else ""
    rows = []
    for s in h.series:
        values = [v for _, v in s.points]
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        bound = fmt_value(s.floor, s.unit) if s.floor is not None else ""
        rows.append(f"<tr><td>{esc(s.check)}</td><td>{esc(s.name)}{f' <span class=muted>{esc(labels)}</span>' if labels else ''}</td>"
                    f"<td style=\"font-family:monospace\">{esc(sparkline(values))}</td><td>{esc(fmt_value(values[0], s.unit))} &rarr; "
                    f"{esc(fmt_value(values[-1], s.unit))}</td><td>{esc(bound)}</td></tr>")
    span = "the last run" if len(h.runs) == 1 else f"the last {len(h.runs)} runs"
    newest = f", the newest finished {h.runs[-1].finished_at:%Y-%m-%d %H:%M} UTC" if h.runs else ""
    return (f"<section><h2>Trends over {span}</h2><p class=\"muted\">From the node's history "
            f"(<code>preflight history</code>), oldest to newest{esc(newest)}, each figure scaled to its own range.</p>"
            f'<div class="scroll"><table><tr><th>check</th><th>figure</th><th>trend</th><th>first &rarr; last</th><th>floor</th></tr>{"".join(rows)}</table></div></section>')


def _p2p(r: Report) -> str:
    m = facts.p2p(r)
    if m is None:
        n = facts.gpu_count(r)
        # The count comes from the node's shape or the cuda check: a run with neither (the cpu profile, `--only shm`) names none.
        why = "no GPU in this report" if n == 0 else "one GPU: no pair to copy between"
        return f"<section><h2>GPU to GPU bandwidth</h2><p>{why}.</p></section>"
    floor = f"; floor {fmt(m.floor, 'bytes_per_second')}, cells below it red with an x" if m.floor is not None else ""
    return (f"<section><h2>GPU to GPU bandwidth (GB/s)</h2><p class=\"muted\">{esc(m.note)}{esc(floor)}.</p>"
            f'<div class="scroll">{page_svg.heatmap(m)}</div></section>')


def _layout(r: Report) -> str:
    lay = page_layout.layout(r)
    if lay is None:
        return f"<section><h2>Layout</h2>{_absent(r, 'topology')}</section>"
    return (f'<section><h2>Layout</h2><p class="muted">From {esc(lay.source)}.</p>'
            f'<div class="scroll">{page_layout.picture(lay)}</div></section>')


def _absent(r: Report, check: str, note: str = "") -> str:
    """Why a section has nothing to draw: the check was not in the run, or what it said."""
    c = next((c for c in r.checks if c.check == check), None)
    if c is None:
        return f"<p>The {check} check was not in this run{note}.</p>"
    return f"<p>{esc(check)} {esc(c.status.value)}: {esc(c.summary)}</p>"


def _traces(r: Report) -> str:
    out = []
    for title, check, charts, note in (("Training probe", "train", page_traces.train_charts(r), ""),
                                       ("Burn-in", "burnin", page_traces.burnin_charts(r), " (it runs at --level full)")):
        body = "".join(f'<h3>{esc(c.title)}</h3><div class="scroll">{page_svg.chart(c)}</div>' for c in charts)
        out.append(f"<section><h2>{title}</h2>{body or _absent(r, check, note)}</section>")
    return "".join(out)


def _group(r: Report) -> str:
    rows = facts.group_rows(r)
    if rows is None:
        return ""
    g = r.group
    names = sorted({k for row in rows for k in row.figures})
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    body = []
    for row in rows:
        colour = {"ok": COLOURS["PASS"], "failed": COLOURS["FAIL"], "missing": COLOURS["ERROR"]}[row.state]
        cells = "".join(f"<td>{esc(_figure(n, row.figures[n]) if n in row.figures else '-')}</td>" for n in names)
        body.append(f'<tr class="node" data-state="{row.state}"><td>{row.node_rank}</td><td>{esc(row.host)}</td><td>{esc(row.addr)}</td>'
                    f'<td class="st" style="color:{colour}">{row.state}</td><td>{esc(row.why)}</td>{cells}</tr>')
    said = f"{g.nnodes} nodes, meeting at {g.endpoint} (run {g.rdzv_id}); this is node rank {g.node_rank}" if g else ""
    if g is not None and g.meeting_error:
        said += f"; the meeting failed: {g.meeting_error}"
    return (f"<section><h2>The group</h2><p>{esc(said)}.</p><div class=\"scroll\"><table><tr><th>node</th><th>host</th><th>address</th>"
            f"<th>state</th><th>why</th>{head}</tr>{''.join(body)}</table></div></section>")


def _figure(name: str, value: float) -> str:
    base = name.split("/")[0]
    unit = "seconds" if base.endswith(("latency", "duration")) else "bytes_per_second" if base.endswith("bandwidth") else ""
    return fmt(value, unit)
