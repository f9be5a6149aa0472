"""The Report model's fields as pipeline/report_view.py checks them, without pydantic.

Each field of findings.Measurement, check.Result, shape.NodeShape and report's
GroupNode, GroupRecord, HeldBack and Report, with its type and constraints,
checked strictly: a value the model might coerce or refuse is ``Declined``,
and the model decides. Here too the words a report is written in (verdicts,
statuses, actions, domains, levels), which readers import without pydantic.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any, Callable

# The most nodes one group may have (--nnodes); readers of a report rely on it too:
# serve renders a series per node.
MAX_NODES = 4096


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


class Declined(Exception):
    """Not the form `preflight run` writes: the Report model decides (settings_view
    raises it too, as Unsure: the settings loader decides)."""


# ---- the model's field types, strictly -------------------------------------------

INT64 = 2**63
Check = Callable[[Any], Any]
_REQUIRED = object()


def _str(v: Any) -> str:
    if type(v) is not str:
        raise Declined
    return v


def _int(lo: int = -INT64, hi: int = INT64 - 1) -> Check:
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
check_report = _model(REPORT)  # a whole report document, checked field by field
