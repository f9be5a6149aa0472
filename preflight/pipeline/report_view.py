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
fixture and many damaged variants, and fails when the models gain a field
or a validator this reader does not know.
"""

from __future__ import annotations

import json
import math
import os
import re
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

from preflight.base.actions import NOTHING, Action, Domain, Next, decide, default_for

# Root's state: the systemd units' StateDirectory, and where `run` as root writes its report by default.
ROOT_STATE_DIR = Path("/var/lib/preflight")
DEFAULT_REPORT_PATH = ROOT_STATE_DIR / "report.json"
# The most nodes one group may have (--nnodes); readers of a report rely on it too:
# serve renders a series per node.
MAX_NODES = 4096


def default_report_path(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """The report `run` writes and every reader reads when neither a flag nor the settings name one.
    Root: DEFAULT_REPORT_PATH, the node's own. Anyone else: their own state directory, as the
    XDG Base Directory spec puts it: ``$XDG_STATE_HOME/preflight/report.json`` where that is
    an absolute path (a relative one is invalid and ignored), else ``~/.local/state/preflight/report.json``."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return ROOT_STATE_DIR / "report.json"  # DEFAULT_REPORT_PATH; read here, where the tests move it
    environ = os.environ if environ is None else environ
    state = environ.get("XDG_STATE_HOME", "")
    if state.startswith("/"):
        return Path(state) / "preflight" / "report.json"
    home = environ.get("HOME", "")
    if not home.startswith("/"):
        import pwd  # as os.path.expanduser does, for this user rather than the process's HOME

        try:
            home = pwd.getpwuid(euid).pw_dir
        except KeyError:
            home = "/"
    return Path(home) / ".local" / "state" / "preflight" / "report.json"


def node_report_path() -> Path:
    """The node's own report, whoever asks: what the systemd units and every root run write, and
    what the readers that act for the node (slurm-healthcheck, kube-label, serve, `status --npd`)
    read when nothing names one; never a user's own, which the user could write."""
    return ROOT_STATE_DIR / "report.json"


def reader_report_path(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """The report a person's reader (status, report, history) reads when neither a flag nor the
    settings name one: the user's own default where they have one that no other user could
    have written, else the node's. An admin asking `preflight status` without sudo, with no
    report of their own, reads the node's verdict."""
    euid = os.geteuid() if euid is None else euid
    own, node = default_report_path(environ, euid), node_report_path()
    if own == node or _own(own, euid) or not node.exists():
        return own
    return node


def _own(path: Path, euid: int) -> bool:
    """``path`` is there, and neither it nor its directory is another user's or writable by others."""
    try:
        for st in (os.stat(path), os.stat(path.parent)):
            if st.st_uid != euid or st.st_mode & 0o022:
                return False
    except OSError:
        return False
    return True


class Verdict(str, Enum):
    PASS = "pass"  # warnings allowed
    FAIL = "fail"  # a check failed: drain the node
    ERROR = "error"  # preflight itself broke, or a signal stopped the run (interrupted_by_signal): the node is not vouched for

    def __str__(self) -> str:
        return self.value


# findings.Status by value (base/findings.py imports pydantic); the tests hold them equal.
STATUSES = ("PASS", "WARN", "FAIL", "SKIP", "ERROR")
VOUCHING = ("PASS", "WARN", "SKIP")  # Status.ok: the node may take the job
# actions.Action and actions.Domain by value, the ladder lowest first; the tests hold them equal.
ACTIONS = ("none", "watch", "fix-job", "drain", "reset-gpu", "reboot", "service")
DOMAINS = ("node", "software", "job")
# How deep a run looked, lightest first (preflight/pipeline/levels.py).
LEVELS = ("quick", "standard", "full")


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


class Declined(Exception):
    """Not the form `preflight run` writes: the Report model decides (settings_view
    raises it too, as Unsure: the settings loader decides)."""


def view(data: bytes) -> ReportView | None:
    try:
        text = data.decode("utf-8")
        if _SURROGATE.search(text):  # json and pydantic may treat a lone surrogate apart
            return None
        doc = json.loads(text, object_pairs_hook=_object, parse_constant=_decline, parse_int=_int_literal, parse_float=_float_literal)
        if _deeper_than(doc, _MAX_DEPTH):
            return None
        r = _REPORT(doc)
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
_INT64 = 2**63


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):  # a duplicate key: which one wins is the parser's choice
        raise Declined
    return d


def _decline(_: str) -> Any:
    raise Declined  # NaN, Infinity


def _int_literal(s: str) -> int:
    v = int(s)
    if not -_INT64 <= v < _INT64:
        raise Declined
    return v


def _float_literal(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):  # 1e999
        raise Declined
    return v


# ---- the model's field types, strictly -------------------------------------------

Check = Callable[[Any], Any]
_REQUIRED = object()


def _str(v: Any) -> str:
    if type(v) is not str:
        raise Declined
    return v


def _int(lo: int = -_INT64, hi: int = _INT64 - 1) -> Check:
    def check(v: Any) -> int:
        if type(v) is not int or not lo <= v <= hi:
            raise Declined
        return v

    return check


def _float(v: Any) -> float:
    if type(v) not in (int, float):
        raise Declined
    return float(v)


def _bool(v: Any) -> bool:
    if type(v) is not bool:
        raise Declined
    return v


def one_of(*values: str) -> Check:
    def check(v: Any) -> str:
        if type(v) is not str or v not in values:
            raise Declined
        return v

    return check


def _matching(pattern: str) -> Check:
    rx = re.compile(pattern)

    def check(v: Any) -> str:
        if type(v) is not str or not rx.fullmatch(v):
            raise Declined
        return v

    return check


_DATETIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(?:(Z)|([+-])(\d\d):(\d\d))")


def _datetime(v: Any) -> datetime:
    """RFC 3339 with a zone, as the report writes it; a naive or odd form is the model's to judge."""
    m = _DATETIME.fullmatch(v) if type(v) is str else None
    if m is None:
        raise Declined
    year, month, day, hour, minute, second, frac, z, sign, oh, om = m.groups()
    if z:
        tz = timezone.utc
    elif int(oh) > 23 or int(om) > 59:
        raise Declined
    else:
        offset = timedelta(hours=int(oh), minutes=int(om))
        tz = timezone(-offset if sign == "-" else offset)
    micro = int((frac or "").ljust(6, "0"))
    return datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=tz)  # ValueError: declined


def _any(v: Any) -> Any:
    return v


def _opt(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def _list(check: Check) -> Check:
    def each(v: Any) -> list[Any]:
        if type(v) is not list:
            raise Declined
        return [check(x) for x in v]

    return each


def _dict(check: Check, key: Check = _str) -> Check:
    def each(v: Any) -> dict[str, Any]:
        if type(v) is not dict:
            raise Declined
        return {key(k): check(x) for k, x in v.items()}

    return each


def _model(fields: dict[str, tuple[Check, Any]], rule: Callable[[dict[str, Any]], bool] = lambda _: True) -> Check:
    """An object with these fields (unknown keys are ignored, as the models ignore or keep them)."""

    def check(v: Any) -> dict[str, Any]:
        if type(v) is not dict:
            raise Declined
        out = {}
        for name, (field, default) in fields.items():
            if name in v:
                out[name] = field(v[name])
            elif default is _REQUIRED:
                raise Declined
            else:
                out[name] = default
        if not rule(out):
            raise Declined
        return out

    return check


# The fields of findings.Measurement, check.Result, shape.NodeShape, report.GroupNode,
# report.GroupRecord and report.Report, each with its type and constraints.
# Measurement's validators: snake_case name and unit, Prometheus label names.
_SNAKE = r"[a-z][a-z0-9_]*"
_LABEL = r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*"

MEASUREMENT = {
    "name": (_matching(_SNAKE), _REQUIRED),
    "unit": (_matching(_SNAKE), _REQUIRED),
    "value": (_float, _REQUIRED),
    "labels": (_dict(_str, key=_matching(_LABEL)), {}),
    "floor": (_opt(_float), None),
    "ceiling": (_opt(_float), None),
    "repeats": (_opt(_int()), None),
    "ci": (_opt(_float), None),
    "converged": (_opt(_bool), None),
}
RESULT = {
    "check": (_str, _REQUIRED),
    "status": (one_of(*STATUSES), _REQUIRED),
    "summary": (_str, _REQUIRED),
    "cause": (_opt(_str), None),
    "remedy": (_opt(_str), None),
    "measurements": (_list(_model(MEASUREMENT)), []),
    "details": (_dict(_any), {}),
    "duration_seconds": (_float, 0.0),
    "lines": (_list(_str), []),
    "action": (_opt(one_of(*ACTIONS)), None),
    "domain": (_opt(one_of(*DOMAINS)), None),
    "action_source": (_opt(_str), None),
}
NODE_SHAPE = {
    "gpus": (_int(), _REQUIRED),
    "gpus_from": (_str, _REQUIRED),
    "slots": (_list(_str), []),
    "pci_gpus": (_opt(_list(_str)), None),
    "device_nodes": (_opt(_list(_int())), None),
    "nvml_gpus": (_opt(_int()), None),
    "fabric": (one_of("single", "nvswitch", "nvlink", "pcie", "unknown"), "unknown"),
    "fabric_from": (_str, ""),
    "nvswitches": (_int(), 0),
    "nics": (_list(_str), []),
    "nics_from": (_str, "sysfs /sys/class/infiniband"),
    "pinned": (_opt(_int()), None),
    "notes": (_list(_str), []),
    "host_gpus": (_opt(_int()), None),
}
GROUP_NODE = {
    "node_rank": (_int(lo=0), _REQUIRED),
    "ok": (_bool, False),
}


def _ranks_in_the_group(g: dict[str, Any]) -> bool:
    ranks = (g["node_rank"], *(n["node_rank"] for n in g["nodes"]), *g["missing"])
    return all(0 <= rank < g["nnodes"] for rank in ranks)


GROUP_RECORD = {
    "nnodes": (_int(lo=1, hi=MAX_NODES), _REQUIRED),
    "node_rank": (_int(lo=0), _REQUIRED),
    "endpoint": (_str, _REQUIRED),
    "rdzv_id": (_str, _REQUIRED),
    "local_addr": (_opt(_str), None),
    "passed": (_bool, False),
    "nodes": (_list(_model(GROUP_NODE)), []),
    "missing": (_list(_int()), []),
    "meeting_error": (_opt(_str), None),
}
HELD_BACK = {
    "by": (_str, _REQUIRED),
    "said": (_str, _REQUIRED),
    "at": (_datetime, _REQUIRED),
}
REPORT = {
    "schema_version": (_int(lo=1, hi=1), 1),  # the Report model's SCHEMA_VERSION
    "tool": (_str, "preflight"),
    "version": (_str, _REQUIRED),
    "hostname": (_str, _REQUIRED),
    "boot_id": (_opt(_str), _REQUIRED),
    "profile": (_opt(_str), _REQUIRED),
    "profile_chosen_because": (_opt(_str), None),
    "level": (_opt(one_of(*LEVELS)), None),
    "level_chosen_because": (_opt(_str), None),
    "config": (_opt(_str), None),
    "started_at": (_datetime, _REQUIRED),
    "finished_at": (_datetime, _REQUIRED),
    "duration_seconds": (_float, _REQUIRED),
    "verdict": (one_of(*(v.value for v in Verdict)), _REQUIRED),
    "exit_code": (_int(), _REQUIRED),
    "keep_going": (_bool, False),
    "interrupted_by_signal": (_opt(_int()), None),
    "versions": (_dict(_str), {}),
    "last_success_at": (_opt(_datetime), None),
    "group": (_opt(_model(GROUP_RECORD, _ranks_in_the_group)), None),
    "shape": (_opt(_model(NODE_SHAPE)), None),
    "checks": (_list(_model(RESULT)), _REQUIRED),
    "history": (_opt(_model(RESULT)), None),
    "held_back": (_opt(_model(HELD_BACK)), None),
}
_REPORT = _model(REPORT)
