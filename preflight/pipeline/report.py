"""The verdict as machines read it: the Report model, its verdict and what a run keeps of the last one.

It is written by base/safefile.py (outputs/gate.py), as everything root writes at a path a person gave."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, model_validator

from preflight.base.actions import Action, Domain, Next, decide
from preflight.pipeline import levels
from preflight.pipeline.check import Result
from preflight.pipeline.runner import CUT_SHORT
from preflight.base.findings import Measurement, Status
from preflight.base import safefile

# Defined beside the reader that needs no pydantic (status); re-exported here.
from preflight.pipeline.report_paths import DEFAULT_REPORT_PATH  # noqa: F401
from preflight.pipeline.report_schema import MAX_NODES, Verdict  # noqa: F401
from preflight.pipeline.shape import NodeShape

SCHEMA_VERSION = 1
EXIT_CODES = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.ERROR: 3}
EXIT_USAGE = 2


class GroupNode(BaseModel):
    """One node as it told the meeting point: ok, and why not; its host, address,
    checks and figures ride along as they came."""

    model_config = ConfigDict(extra="allow")

    node_rank: int = Field(ge=0)
    ok: bool = False


class GroupRecord(BaseModel):
    """A run across nodes, as this node saw it (node rank 0's is the group's record).
    Typed, so a damaged report is refused on reading rather than breaking serve's
    /metrics halfway through a scrape."""

    model_config = ConfigDict(extra="allow")

    nnodes: int = Field(ge=1, le=MAX_NODES)
    node_rank: int = Field(ge=0)
    endpoint: str
    rdzv_id: str
    local_addr: str | None = None
    passed: bool = False
    nodes: list[GroupNode] = Field(default_factory=list)
    missing: list[int] = Field(default_factory=list)  # node ranks that never said
    meeting_error: str | None = None

    @model_validator(mode="after")
    def _ranks_in_the_group(self) -> GroupRecord:
        for rank in (self.node_rank, *(n.node_rank for n in self.nodes), *self.missing):
            if not 0 <= rank < self.nnodes:
                raise ValueError(f"node rank {rank} is outside a {self.nnodes}-node group")
        return self


class HeldBack(BaseModel):
    """What a scheduler integration did not do for this report, and why, in its words."""

    by: str  # the tool: "slurm-healthcheck"
    said: str  # "would drain: 2 of 10 nodes already drained by preflight, past the cap (...)"
    at: datetime


class Report(BaseModel):
    model_config = ConfigDict(validate_assignment=True)

    # A newer preflight's report may mean its fields differently: refused, never half-read.
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    tool: str = "preflight"
    version: str
    hostname: str
    boot_id: str | None  # a report from before the last reboot says nothing about this boot
    profile: str | None
    profile_chosen_because: str | None = None
    # How deep the run looked (quick, standard, full) and why that level; None:
    # a report from before levels existed, which ran what is now standard.
    level: Literal["quick", "standard", "full"] | None = None
    level_chosen_because: str | None = None
    config: str | None = None
    started_at: datetime  # RFC 3339, UTC
    finished_at: datetime
    duration_seconds: float
    verdict: Verdict
    exit_code: int
    keep_going: bool = False
    interrupted_by_signal: int | None = None
    # driver, cuda (the newest CUDA the driver supports), torch: what the checks saw, for preflight_info.
    versions: dict[str, str] = Field(default_factory=dict)
    # The last passing run's finish, carried from the report this one replaces:
    # "has not passed since boot" compares it with the boot time.
    last_success_at: datetime | None = None
    # Across nodes (--nnodes): the group, every node's outcome as it told this one
    # (node rank 0's is the group's record), and the nodes that never said.
    group: GroupRecord | None = None
    # How many GPUs the node gave the run and how they are joined, and how each was learnt.
    shape: NodeShape | None = None
    checks: list[Result]
    # The node against its own past (outputs/record/history_judge.py): drift and lemons, judged from the
    # history beside the report before this report was written; None where the run keeps none.
    # Not a check: no run carries it forward, and it never changes the verdict, only the action.
    history: Result | None = None
    # A scheduler integration that held back what this report asks for (slurm-healthcheck past its
    # cap on drains): written into this report by that tool (outputs/schedulers/held_back.py); a new run's
    # report has none until the tool holds back again.
    held_back: HeldBack | None = None

    # What to do about the node (preflight.base.actions), derived from the checks, so a result
    # carried from an earlier run counts as it stands: the highest of the checks' actions.
    @computed_field  # type: ignore[prop-decorator]
    @property
    def action(self) -> Action:
        return self._next()[0].action

    @computed_field  # type: ignore[prop-decorator]
    @property
    def domain(self) -> Domain:
        return self._next()[0].domain

    @computed_field  # type: ignore[prop-decorator]
    @property
    def action_source(self) -> str:
        return self._next()[0].source

    @computed_field  # type: ignore[prop-decorator]
    @property
    def action_check(self) -> str | None:
        """The check whose finding decided the action; None where nothing asks for one."""
        return self._next()[1]

    @property
    def results(self) -> list[Result]:
        """The results that decide an action: the checks', and the history's (drift, a lemon), though it is no check."""
        return [*self.checks, *([self.history] if self.history else [])]

    def _next(self) -> tuple[Next, str | None]:
        return decide([(c.next, c.check) for c in self.results])


def verdict_of(results: list[Result], interrupted: int | None = None) -> Verdict:
    """Any FAIL is a node problem (exit 1); else any ERROR is a tool problem
    (exit 3). Both are non-zero, so a gate fails closed either way. A run a
    signal stopped did not finish: it vouches for nothing, whatever the results
    it kept from an earlier run say (ERROR, unless a check failed)."""
    statuses = {r.status for r in results}
    if Status.FAIL in statuses:
        return Verdict.FAIL
    if Status.ERROR in statuses or interrupted:
        return Verdict.ERROR
    return Verdict.PASS


def exit_code_of(verdict: Verdict, interrupted: int | None = None) -> int:
    """128+N for a run signal N stopped, as a shell reports a command it killed; else the verdict's."""
    return 128 + interrupted if interrupted else EXIT_CODES[verdict]


def versions_of(results: list[Result]) -> dict[str, str]:
    """The driver and CUDA version NVML gave the cuda check, the torch the workers imported, and
    the GPU model NVML names (``gpu``: what the fleet rules compare a node with; " + " between
    several): one profile (generic) may judge many models."""
    out: dict[str, str] = {}
    for r in results:
        # The cuda check's versions once CUDA init ran; its NVML inventory alone when init never did.
        said = {**(r.details.get("inventory") or {}), **(r.details.get("versions") or {})}
        models = sorted({str(g["name"]) for g in said.get("gpus") or [] if isinstance(g, dict) and g.get("name")})
        if models and "gpu" not in out:
            out["gpu"] = " + ".join(models)
        said.setdefault("driver", said.get("driver_version"))
        said.setdefault("cuda_driver", said.get("cuda_driver_version"))
        for key, field in (("driver", "driver"), ("cuda", "cuda_driver"), ("torch", "torch")):
            if said.get(field) and key not in out:
                out[key] = str(said[field])
        for rank in r.details.get("ranks") or []:
            torch = ((rank or {}).get("report") or {}).get("torch_version") if isinstance(rank, dict) else None
            if torch and "torch" not in out:
                out["torch"] = str(torch)
    return out


def read_previous(path: Path | None) -> Report | None:
    """The report this run is about to replace; None if there is none we can trust:
    one another user could have written or put there (a report in /tmp) must not
    lend this run results it never measured (carry_forward)."""
    if path is None or (raw := safefile.read_own(path)) is None:
        return None
    try:
        return Report.model_validate_json(raw)
    except ValidationError:
        return None


def last_success(report: Report, before: Report | None) -> datetime | None:
    """This run's finish if it passed, else the last pass the report it replaces knew of."""
    return report.finished_at if report.verdict == Verdict.PASS else earlier_success(before)


def earlier_success(before: Report | None) -> datetime | None:
    """The last pass the report a run replaces knew of."""
    if before is None:
        return None
    # A report written before last_success_at existed still says whether it passed.
    return before.last_success_at or (before.finished_at if before.verdict == Verdict.PASS else None)


def carry_forward(report: Report, before: Report | None, order: list[str], across_nodes: bool = False) -> list[Result]:
    """A partial run (--only, --skip) or a lighter one (--level quick: the hourly
    recheck, a prolog) keeps what the report it replaces measured and it did not,
    if that report is of this boot and profile, and neither is a run across nodes
    (``across_nodes`` says so of this one even when it was cut short before its
    group record was made). So a lighter pass never turns the gate's bandwidth
    FAIL into a pass, and the gate's figures stay in the metrics:

    - a check this run left out is kept whole;
    - a check this run looked at less deeply than its kept result was measured
      (cuda at quick runs no CUDA init) keeps that deeper result whole where it
      failed and this look did not fail (only as deep a look may clear it), and
      otherwise takes this look's result plus the deeper one's figures it did
      not take, or took unjudged (details.carried_measurements).

    A run a signal stopped (SIGTERM) keeps the same way what it did not finish:
    the check it stopped and those it then skipped (marked runner.CUT_SHORT)
    take the previous result, with details.interrupted saying what this run
    had of it; its verdict still vouches for nothing (verdict_of).

    Each kept result says when and at which level it was measured
    (details.carried_from, details.carried_level), which later runs keep.
    Returns the results kept whole."""
    if before is None or report.boot_id is None or before.boot_id != report.boot_id or before.profile != report.profile:
        return []
    if across_nodes or before.group is not None or report.group is not None:
        return []  # a group's nccl and bandwidth say nothing of this node alone, nor it of them
    old = {c.check: c for c in before.checks}
    # What this run left unfinished, where the report it replaces has a finished result to keep.
    cut = {c.check: c for c in report.checks if CUT_SHORT in c.details and c.check in old and CUT_SHORT not in old[c.check].details}
    ran = {c.check for c in report.checks}
    left_out = [_carried(c, before) for c in before.checks if c.check not in ran and c.check in order]
    stood_in = [_stood_in(old[c.check], before, c) for c in cut.values()]
    looked_again = [_deeper_of(c, old[c.check], before, report.level) if c.check in old else c for c in report.checks if c.check not in cut]
    if not left_out and not stood_in and looked_again == report.checks:
        return []
    report.checks = sorted([*looked_again, *left_out, *stood_in], key=lambda c: order.index(c.check) if c.check in order else -1)
    report.versions = {**versions_of(report.checks), **report.versions}  # what this run saw wins
    report.verdict = verdict_of(report.checks, report.interrupted_by_signal)
    report.exit_code = exit_code_of(report.verdict, report.interrupted_by_signal)
    return [*left_out, *stood_in, *(c for c in looked_again if "carried_from" in c.details)]


def _measured(c: Result, before: Report) -> tuple[str, str]:
    """When and at which level a result of ``before`` was measured: its own, if it was carried there."""
    return c.details.get("carried_from") or before.finished_at.isoformat(), c.details.get("carried_level") or before.level or levels.DEFAULT


def _carried(c: Result, before: Report) -> Result:
    when, level = _measured(c, before)
    details = {k: v for k, v in c.details.items() if k != "interrupted"}  # an earlier run's interruption is not this one's
    return c.model_copy(update={"details": {**details, "carried_from": when, "carried_level": level}})


def _stood_in(old: Result, before: Report, cut: Result) -> Result:
    """The previous result of a check this run did not finish, with what this run had of it."""
    kept = _carried(old, before)
    kept.details["interrupted"] = {"signal": cut.details[CUT_SHORT], "status": cut.status.value, "summary": cut.summary}
    return kept


def _judged(m: Measurement) -> bool:
    return m.floor is not None or m.ceiling is not None


def _deeper_of(new: Result, old: Result, before: Report, level: str | None) -> Result:
    """What stands of a check this run (at ``level``) looked at again, against the
    result the report it replaces holds for it."""
    when, old_level = _measured(old, before)
    if not levels.deeper(old_level, level):
        return new
    if not old.status.ok and new.status != Status.FAIL:
        # What the deeper look found (CUDA init failed) is not what this lighter one looked at.
        kept = _carried(old, before)
        kept.details["lighter_look"] = {"level": level, "status": new.status.value, "summary": new.summary}
        return kept
    if new.status == Status.SKIP:
        return new
    key = lambda m: (m.name, tuple(sorted(m.labels.items())))  # noqa: E731
    mine = {key(m): m for m in new.measurements}
    taken = [m for m in old.measurements if key(m) not in mine or (_judged(m) and not _judged(mine[key(m)]))]
    if not taken:
        return new
    replaced = {key(m) for m in taken}
    carried = {"from": when, "level": old_level, "names": sorted({m.name for m in taken})}
    return new.model_copy(update={
        "measurements": [m for m in new.measurements if key(m) not in replaced] + taken,
        "details": {**new.details, "carried_measurements": carried},
    })
