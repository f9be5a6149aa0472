"""What a judge says about the node: a status, the numbers it measured, what it found wrong.

Everything below the pipeline (readers, GPU-work runners) and above it
(checks, outputs) speaks these; the check interface (preflight.pipeline.check)
re-exports them for plugins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel, Field, field_validator

from preflight.base.actions import LADDER, Action, Next, default_for


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
    # A figure timed over repeats: how many, how sure (the 95% interval's far end over
    # the figure, less 1) and whether that is within the profile's tolerance.
    repeats: int | None = None
    ci: float | None = None
    converged: bool | None = None

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


@dataclass(frozen=True)
class Finding:
    """One thing a judge found wrong (or worth a warning) on the node."""

    status: Status  # WARN or FAIL
    summary: str
    cause: str
    remedy: str
    act: Next | None = None  # what to do and whose fault it is; None: the status's (actions.default_for)

    @property
    def next(self) -> Next:
        """Its action; a warning's at most fix-job: the node keeps taking jobs, so no automation
        may take it out for one (a setup that warns on the host would otherwise drain a vouched node)."""
        n = self.act or default_for(self.status)
        if self.status == Status.WARN and LADDER.index(n.action) > LADDER.index(Action.FIX_JOB):
            return Next(Action.WATCH, n.domain, f"{n.source}; a warning: watched, the node keeps its jobs")
        return n


SEVERITY = [Status.PASS, Status.SKIP, Status.WARN, Status.FAIL, Status.ERROR]


def worst(findings: list[Finding]) -> str:
    """The status a part of a check earns from its findings ("FAIL", "WARN" or "PASS"), for details.parts."""
    return max((f.status for f in findings), key=SEVERITY.index, default=Status.PASS).value
