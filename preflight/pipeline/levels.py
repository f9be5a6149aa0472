"""Levels: how deep a run looks, chosen for the moment it runs in.

A profile lists its checks per level, each deeper level running every check
of the one before it:

- ``quick``: no torch and no GPU work (NVML, the kernel log, topology, shm);
  seconds, for a Slurm prolog and the hourly recheck.
- ``standard``: every check that proves a node will train at speed; the boot gate.
- ``full``: standard plus the long checks (burn-in, memory test) for new or
  repaired nodes. None ships yet, so today every built-in profile's full is
  its standard.

``choose`` picks the level a run goes to: the one asked for, or under a time
budget the deepest whose expected time fits, from this node's last report
where it measured the level's checks, else the profile's estimate. It is a
pure function of those facts; ``durations`` reads them from a report.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple, Protocol, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from preflight.base.errors import UsageError
from preflight.pipeline.report_schema import LEVELS

DEFAULT = "standard"
_WHERE_LEVEL = "(--level, PREFLIGHT_LEVEL or config)"
_WHERE_BUDGET = "(--budget or PREFLIGHT_BUDGET)"


class Level(BaseModel):
    """One level of a profile: its checks, in the profile's order, and how long they take."""

    model_config = ConfigDict(extra="forbid")

    checks: list[str] = Field(min_length=1)  # a level that checks nothing would pass every node
    # The level's checks' time in all on a healthy node, start-up not counted:
    # what --budget compares with when this node has no report of its own yet.
    seconds: float = Field(gt=0, le=86400, allow_inf_nan=False)
    source: str = Field(min_length=1)  # where the seconds came from: measured where, or estimated how


class Levels(BaseModel):
    """``[levels.quick]``, ``[levels.standard]``, ``[levels.full]``: all three, nested."""

    model_config = ConfigDict(extra="forbid")

    quick: Level
    standard: Level
    full: Level

    @model_validator(mode="after")
    def _nested(self) -> Levels:
        for name in LEVELS:
            checks = getattr(self, name).checks
            dup = sorted({c for c in checks if checks.count(c) > 1})
            if dup:
                raise ValueError(f"[levels.{name}] lists {', '.join(dup)} more than once")
        for lighter, deeper in zip(LEVELS, LEVELS[1:]):
            left_out = [c for c in getattr(self, lighter).checks if c not in getattr(self, deeper).checks]
            if left_out:
                raise ValueError(f"[levels.{deeper}] leaves out {', '.join(left_out)}, which [levels.{lighter}] runs: each level runs every check of the one before it")
        return self

    def of(self, level: str) -> Level:
        return getattr(self, level)


def check_against(levels: Levels, checks: list[str]) -> None:
    """Every level names checks of the profile, in its order, and full runs them all
    (a check no level runs would never be judged). Raises ValueError."""
    for name in LEVELS:
        named = levels.of(name).checks
        stray = [c for c in named if c not in checks]
        if stray:
            raise ValueError(f"[levels.{name}] names {', '.join(stray)}, not in checks ({', '.join(checks)})")
        if named != sorted(named, key=checks.index):
            raise ValueError(f"[levels.{name}] lists {', '.join(named)}; keep the order of checks ({', '.join(checks)}): cheapest first")
    missing = [c for c in checks if c not in levels.full.checks]
    if missing:
        raise ValueError(f"[levels.full] leaves out {', '.join(missing)}: full runs every check in checks; add it to the levels it belongs to")


def checks_at(levels: Levels | None, checks: list[str], level: str, profile: str) -> list[str]:
    """The checks a run at ``level`` may run. A profile without ``[levels]`` (a site
    profile written before levels existed) runs every check at standard and full,
    and has no quick level: which checks are light enough is the profile's to say."""
    if levels is not None:
        return levels.of(level).checks
    if level == "quick":
        raise UsageError(
            f"level quick {_WHERE_LEVEL}: profile {profile} has no [levels] tables, so no quick level; "
            "add [levels.quick], [levels.standard] and [levels.full] to it (see the built-in profiles)"
        )
    return checks


class _Result(Protocol):
    check: str
    status: str
    duration_seconds: float


class _Report(Protocol):
    """What ``durations`` reads of a report (preflight.pipeline.report.Report)."""

    profile: str | None
    finished_at: datetime
    checks: Sequence[_Result]


class _Profile(Protocol):
    """What ``pick`` reads of a resolved profile (preflight.pipeline.profiles.ResolvedProfile)."""

    name: str
    checks: list[str]
    levels: Levels | None


class Expected(NamedTuple):
    seconds: float
    source: str  # "this node's report ..." or "the profile's estimate: ..."


def durations(report: _Report | None, path: object, profile: str) -> tuple[dict[str, float], str]:
    """Each check's time in this node's last report (carried results too: they kept
    the time they took), if it judged the same profile; a SKIP took no real time and
    is left out. Returns (times, where they came from)."""
    if report is None or report.profile != profile:
        return {}, ""
    times = {c.check: c.duration_seconds for c in report.checks if c.status != "SKIP"}
    return times, f"this node's report {path} of {report.finished_at:%Y-%m-%d %H:%M:%S} UTC"


def expected(level: Level | None, selected: list[str], times: dict[str, float], where: str) -> Expected | None:
    """How long the ``selected`` checks of a level should take: their sum in this node's
    report where it has every one of them, else the profile's estimate for the level
    (which counts the whole level, so it errs long under --only or --skip)."""
    if selected and all(c in times for c in selected):
        return Expected(round(sum(times[c] for c in selected), 3), where)
    if level is None:
        return None
    return Expected(level.seconds, f"the profile's estimate ({level.source})")


def pick(p: _Profile, asked: str | None, budget: float | None, only: list[str], skip: list[str],
         previous: _Report | None, path: object) -> tuple[str, str]:
    """``choose`` for a resolved profile and this run's --only/--skip, the expected
    times read from ``previous`` (the report at ``path``) where it has them. A level
    that would run none of the selected checks, or lacks one --only names, is no candidate."""
    if budget is None:
        return choose(asked, None, {})
    times, where = durations(previous, path, p.name)
    expect: dict[str, Expected | None] = {}
    for name in LEVELS:
        if p.levels is None and name == "quick":
            expect[name] = None
            continue
        at = checks_at(p.levels, p.checks, name, p.name)
        selected = [c for c in at if (not only or c in only) and c not in skip]
        fits_only = all(c in at for c in only)
        level = p.levels.of(name) if p.levels else None
        expect[name] = expected(level, selected, times, where) if selected and fits_only else None
    return choose(asked, budget, expect)


def choose(asked: str | None, budget: float | None, expect: dict[str, Expected | None]) -> tuple[str, str]:
    """The level to run and why. ``asked``: the level setting (None: not given);
    ``budget``: seconds the run may be expected to take (None: none);
    ``expect``: each level's expected time, None where nothing says."""
    if budget is None:
        return (asked, f"asked for {_WHERE_LEVEL}") if asked else (DEFAULT, "the default level")
    top = LEVELS.index(asked) if asked else len(LEVELS) - 1
    candidates = LEVELS[: top + 1]
    for level in reversed(candidates):
        e = expect.get(level)
        if e is not None and e.seconds <= budget:
            cap = f" up to {asked}" if asked else ""
            return level, f"budget {budget:g} s {_WHERE_BUDGET}: the deepest level{cap} that fits, expected {e.seconds:g} s from {e.source}"
    quick = expect.get("quick")
    if quick is None:
        said = "no level that runs the selected checks has an expected time"
    else:
        said = f"the quick level is expected to take {quick.seconds:g} s, from {quick.source}"
    raise UsageError(f"budget {budget:g} s {_WHERE_BUDGET} fits no level: {said}; give a larger budget or name a level with --level")


def parse_level(v: object) -> object:
    """A level name: anything else is refused naming the three."""
    if v is None or (isinstance(v, str) and v in LEVELS):
        return v
    raise ValueError(f"{v!r} is not a level; choose one of: {', '.join(LEVELS)}")


def parse_budget(v: object) -> object:
    """Seconds, a positive finite number: "soon", 0, -5, nan and inf are refused."""
    if v is None:
        return v
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a number of seconds")
    try:
        seconds = float(v) if isinstance(v, (str, int, float)) else None
    except ValueError:
        seconds = None
    if seconds is None or not 0 < seconds <= 86400 or seconds != seconds:
        raise ValueError(f"{v!r} is not a number of seconds from above 0 to 86400; give the seconds this run may take, e.g. 30")
    return seconds


def deeper(a: str | None, b: str | None) -> bool:
    """Level ``a`` looks deeper than ``b`` (a report without a level ran standard)."""
    return LEVELS.index(a or DEFAULT) > LEVELS.index(b or DEFAULT)
