"""The interface every check implements, and the values it returns.

A check gathers facts through ``ctx.host`` and judges them against the
profile's floors in a pure function. A finding is a FAIL *result*; an
exception escaping ``run`` is turned into ERROR by the runner.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field, field_validator

from preflight.progress import Progress

if TYPE_CHECKING:
    from preflight.host import Host
    from preflight.profiles import ResolvedProfile
    from preflight.settings import Settings
    from preflight.shape import NodeShape


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"
    ERROR = "ERROR"

    def __str__(self) -> str:
        return self.value

    @property
    def ok(self) -> bool:
        """True where the node may take the job."""
        return self in (Status.PASS, Status.WARN, Status.SKIP)


_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class Measurement(BaseModel):
    """One number in base units, as Prometheus wants it.

    ``name`` carries no unit: the metric becomes ``preflight_{name}_{unit}``.
    """

    name: str  # "shm_size", "allreduce_bus_bandwidth"
    unit: str  # "bytes", "seconds", "bytes_per_second", "ratio", "count", ...
    value: float
    labels: dict[str, str] = Field(default_factory=dict)
    floor: float | None = None
    ceiling: float | None = None

    @field_validator("name", "unit")
    @classmethod
    def _snake_case(cls, v: str) -> str:
        if not _SNAKE.match(v):
            raise ValueError(f"{v!r} must be snake_case (it becomes a metric name)")
        return v

    @field_validator("labels")
    @classmethod
    def _label_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not _LABEL.match(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a Prometheus label name (letters, digits and _, not starting with a digit or __)")
        return v


class Result(BaseModel):
    check: str
    status: Status
    summary: str
    cause: str | None = None
    remedy: str | None = None
    measurements: list[Measurement] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)
    duration_seconds: float = 0.0
    lines: list[str] = Field(default_factory=list)  # a few lines a person reads under the summary (per-op figures)


@dataclass(frozen=True)
class Finding:
    """One thing a judge found wrong (or worth a warning) on the node."""

    status: Status  # WARN or FAIL
    summary: str
    cause: str
    remedy: str


_SEVERITY = [Status.PASS, Status.SKIP, Status.WARN, Status.FAIL, Status.ERROR]


def worst(findings: list[Finding]) -> str:
    """The status a part of a check earns from its findings ("FAIL", "WARN" or "PASS"), for details.parts."""
    return max((f.status for f in findings), key=_SEVERITY.index, default=Status.PASS).value


@dataclass
class Context:
    """What a check may look at: the profile, the settings, the machine, and
    the results of the checks that ran before it (bandwidth reads topology)."""

    profile: ResolvedProfile
    settings: Settings
    host: Host
    results: dict[str, Result] = field(default_factory=dict)
    # time.monotonic() by which the running check must be done: the bound for
    # anything it starts, and where in-process work stops on its own.
    deadline: float = math.inf
    # The group this node runs nccl and bandwidth with (preflight.meeting.Meeting), or None alone.
    meeting: Any = None
    # How many GPUs this node gives the run and how they are joined (preflight.shape); None on a profile without GPUs.
    shape: NodeShape | None = None
    # What the running check is doing now (the console's live line reads it).
    progress: Progress = field(default_factory=Progress)

    def floor(self, name: str) -> float:
        return self.profile.floors[name].value

    def ranks(self, profile_ranks: int | None) -> int:
        """Local ranks for a torchrun check: the person's --nproc-per-node, else one
        per GPU this node gives the run, else the profile's gloo ranks (no GPU)."""
        gpus = self.shape.gpus if self.shape and self.profile.has_gpus else 0
        return self.settings.nproc_per_node or profile_ranks or gpus or 1


class Check(ABC):
    """Base class: one subclass per file in checks/.

    ``name`` must equal the file name, the entry-point name, the CLI name and
    the metric label, so a person can grep one word and find everything.
    """

    name: ClassVar[str]
    description: ClassVar[str]  # what it verifies, one line, for `preflight list`
    requires: ClassVar[tuple[str, ...]] = ()  # checks that must pass first, if they run
    floors: ClassVar[tuple[str, ...]] = ()  # floor names the profile must define
    # Every floor the check may read -> (unit, bound): a profile's floor of that
    # name in another unit ("GB/s") or bound is refused before anything runs.
    floor_units: ClassVar[dict[str, tuple[str, str]]] = {}
    # Floors of figures the whole node makes together (a collective's busbw, a step's time):
    # they judge only the shape they were measured on (preflight.shape.fitting_floors).
    whole_node: ClassVar[tuple[str, ...]] = ()
    timeout_seconds: ClassVar[float] = 60.0
    order: ClassVar[int] = 100  # default position, cheapest first

    def required_floors(self, profile: ResolvedProfile) -> tuple[str, ...]:
        """The floors a profile running this check must define."""
        return self.floors

    def applies(self, ctx: Context) -> str | None:
        """A reason to SKIP on this node, or None to run."""
        return None

    @abstractmethod
    def run(self, ctx: Context) -> Result:
        """Gather facts, judge them, return the verdict."""

    def result(self, status: Status, summary: str, **kw: Any) -> Result:
        return Result(check=self.name, status=status, summary=summary, **kw)

    def conclude(self, findings: list[Finding], ok_summary: str, **kw: Any) -> Result:
        """PASS with ``ok_summary`` if nothing was found; otherwise the worst
        status, led by the worst finding's summary, with every cause and remedy."""
        if not findings:
            return self.result(Status.PASS, ok_summary, **kw)
        ranked = sorted(findings, key=lambda f: _SEVERITY.index(f.status), reverse=True)
        return self.result(
            ranked[0].status,
            ranked[0].summary + (f" (+{len(ranked) - 1} more)" if len(ranked) > 1 else ""),
            cause="; ".join(f.cause for f in ranked),
            # Remedies share clauses ("...; drain the node"): say each once.
            remedy="; ".join(dict.fromkeys(part for f in ranked for part in f.remedy.split("; "))),
            **kw,
        )
