"""The report as its readers judge it, read without pydantic.

node-problem-detector and Slurm run `preflight status` every few minutes;
importing pydantic and building the Report model would cost more than the
whole command may take. ``view`` reads the report as `preflight run` writes
it, every field against the Report model's own types and constraints, and
returns None for anything else: a damaged file, an unusual but valid form
(a numeric string, a date without "T"), a schema it does not know. The
caller then asks the Report model, so what is refused, and every error
message, stay the model's. ``view`` never accepts what the model refuses:
tests/pipeline/test_report_view.py holds it to that field by field, with every
fixture and many damaged variants; the fields and their checks are
pipeline/report_schema.py's, and tests/pipeline/test_report_schema.py fails
when the models gain a field or a validator this reader does not know.
Where the report is: pipeline/report_paths.py.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any, NamedTuple

from preflight.base.actions import NOTHING, Action, Domain, Next, decide, default_for
from preflight.pipeline.report_schema import INT64, Declined, Verdict, check_report


# NamedTuples, not dataclasses: importing dataclasses (and inspect with it) costs
# `status` a fifth of its start-up.
class CheckView(NamedTuple):
    check: str
    status: str  # one of STATUSES
    summary: str
    next: Next = NOTHING  # the result's action (Result.next), its status's where the report names none


def _check_view(c: dict[str, Any]) -> CheckView:
    if c["action"] is None:
        then = default_for(c["status"])
    else:  # as Result's validator fills in what a report leaves out
        then = Next(Action(c["action"]), Domain(c["domain"]) if c["domain"] else default_for(c["status"]).domain, c["action_source"] or "")
    return CheckView(c["check"], c["status"], c["summary"], then)


class ShapeView(NamedTuple):
    gpus: int  # shape.NodeShape.gpus: how many GPUs the node gave the run
    host_gpus: int | None = None  # shape.NodeShape.host_gpus; None: as ``gpus``


class HeldBackView(NamedTuple):
    """Report.held_back, as `status` reads it."""

    by: str
    said: str
    at: datetime


class ReportView(NamedTuple):
    """What `standing` and `status` read of a report, under the Report model's names."""

    verdict: Verdict
    profile: str | None
    boot_id: str | None
    started_at: datetime
    finished_at: datetime
    interrupted_by_signal: int | None
    checks: list[CheckView]
    last_success_at: datetime | None = None
    shape: ShapeView | None = None  # shape.gpus is what the scheduler's views are held to
    history: CheckView | None = None  # Report.history: drift and lemons, which count toward the action as a check
    held_back: HeldBackView | None = None  # Report.held_back: what a scheduler integration held back

    # Report's computed action fields, derived the same way (actions.decide), the history's result with the checks.
    @property
    def results(self) -> list[CheckView]:
        """As Report.results: the checks', and the history's."""
        return [*self.checks, *([self.history] if self.history else [])]

    def _decided(self) -> tuple[Next, str | None]:
        return decide([(c.next, c.check) for c in self.results])

    @property
    def action(self) -> Action:
        return self._decided()[0].action

    @property
    def domain(self) -> Domain:
        return self._decided()[0].domain

    @property
    def action_source(self) -> str:
        return self._decided()[0].source

    @property
    def action_check(self) -> str | None:
        return self._decided()[1]



def view(data: bytes) -> ReportView | None:
    try:
        text = data.decode("utf-8")
        if _SURROGATE.search(text):  # json and pydantic may treat a lone surrogate apart
            return None
        doc = json.loads(text, object_pairs_hook=_object, parse_constant=_decline, parse_int=_int_literal, parse_float=_float_literal)
        if _deeper_than(doc, _MAX_DEPTH):
            return None
        r = check_report(doc)
    except (Declined, ValueError, RecursionError):
        return None
    checks = [_check_view(c) for c in r["checks"]]
    shape = ShapeView(r["shape"]["gpus"], r["shape"]["host_gpus"]) if r["shape"] is not None else None
    history = _check_view(r["history"]) if r["history"] is not None else None
    held = HeldBackView(r["held_back"]["by"], r["held_back"]["said"], r["held_back"]["at"]) if r["held_back"] is not None else None
    return ReportView(Verdict(r["verdict"]), r["profile"], r["boot_id"], r["started_at"], r["finished_at"], r["interrupted_by_signal"], checks,
                      r["last_success_at"], shape, history, held)


# ---- JSON as both parsers read it alike --------------------------------------------

# pydantic's JSON parser refuses nesting past about 200 levels, json.loads takes
# about 1000: anything near that depth goes to the model, which decides.
_MAX_DEPTH = 100


def _deeper_than(doc: object, limit: int) -> bool:
    todo = [(doc, 1)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, (dict, list)):
            if depth > limit:
                return True
            todo.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):  # a duplicate key: which one wins is the parser's choice
        raise Declined
    return d


def _decline(_: str) -> Any:
    raise Declined  # NaN, Infinity


def _int_literal(s: str) -> int:
    v = int(s)
    if not -INT64 <= v < INT64:
        raise Declined
    return v


def _float_literal(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):  # 1e999
        raise Declined
    return v
