"""The interface every check implements, and the values it returns.

A check gathers facts through ``ctx.host`` and judges them against the
profile's floors in a pure function. A finding is a FAIL *result*; an
exception escaping ``run`` is turned into ERROR by the runner.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field, model_validator

from preflight.base.actions import Action, Domain, Next, default_for, highest

from preflight.base.findings import SEVERITY, Finding, Measurement, Status, worst  # noqa: F401  (the plugin interface re-exports them)
from preflight.base.progress import Progress
from preflight.pipeline.floor_bounds import Sane
from preflight.gpuwork.world import Worlds
from preflight.readers.nvidia import nvml, nvml_facts

if TYPE_CHECKING:
    from preflight.base.host import Host
    from preflight.pipeline.profiles import ResolvedProfile
    from preflight.pipeline.settings import Settings
    from preflight.pipeline.shape import NodeShape


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
    # What to do about it (preflight.base.actions): the highest of its findings', else its status's.
    action: Action | None = None
    domain: Domain | None = None
    action_source: str | None = None

    @model_validator(mode="after")
    def _status_action(self) -> Result:
        """A result that names no action (a plugin's, one read from an older report) gets its status's."""
        if self.action is None:
            d = default_for(self.status)
            self.action, self.domain, self.action_source = d.action, d.domain, d.source
        elif self.domain is None:
            self.domain = default_for(self.status).domain
        return self

    @property
    def next(self) -> Next:
        assert self.action is not None and self.domain is not None  # the validator's
        return Next(self.action, self.domain, self.action_source or "")


@dataclass(frozen=True)
class Waiting:
    """What ``run`` returns, in place of its Result, when the rest of its work waits for
    the run's ranks, which are still importing torch (``Worlds.starting``): the runner
    runs the checks behind it that need no ranks meanwhile, then ``rest()`` under what is
    left of this check's timeout, as soon as ``ready()`` or when nothing else can go on.
    ``rest`` must not need a process the first part started: those are swept away between."""

    ready: Callable[[], bool]
    rest: Callable[[], Result]
    doing: str = "waiting for the ranks to import torch"



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
    # The group this node runs nccl and bandwidth with (preflight.gpuwork.meeting.Meeting), or None alone.
    meeting: Any = None
    # How many GPUs this node gives the run and how they are joined (preflight.pipeline.shape); None on a profile without GPUs.
    shape: NodeShape | None = None
    # What the running check is doing now (the console's live line reads it).
    progress: Progress = field(default_factory=Progress)
    # The run's launches of ranks (preflight.gpuwork.world), shared by the checks that need
    # ranks; None: each such check launches its own.
    worlds: Worlds | None = None
    # What checks read as the run began (Check.begin), by check name: rdma's first read of its
    # counters, so the interval to its second runs beside the checks before it.
    readings: dict[str, Any] = field(default_factory=dict)
    # The run's one NVML inventory (the plan's, where detection or the shape read it first);
    # None: one of its own, made at the first check that asks.
    shared_inventory: nvml.Shared | None = None

    def inventory(self, timeout: float = 20.0) -> nvml_facts.Inventory:
        """The NVML facts every check of this run judges: read once, by whoever asks first
        (``timeout`` bounds that read). Raises NvmlUnavailable, the same cause to each."""
        if self.shared_inventory is None:
            self.shared_inventory = nvml.Shared(self.settings.nvml_fake)
        return self.shared_inventory.get(timeout)

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
    # Floor name -> how low (a ceiling: how high) it may sensibly go (preflight.pipeline.floor_bounds):
    # a floor past it judges nothing and is refused before anything runs. Every floor must be above 0.
    floor_sane: ClassVar[dict[str, Sane]] = {}
    # Floors of figures the whole node makes together (a collective's busbw, a step's time):
    # they judge only the shape they were measured on (preflight.pipeline.shape.fitting_floors).
    whole_node: ClassVar[tuple[str, ...]] = ()
    timeout_seconds: ClassVar[float] = 60.0
    order: ClassVar[int] = 100  # default position, cheapest first
    # Whether it may run while a check before it waits for the run's ranks (``Waiting``): it needs
    # no ranks and starts no stage. Built-in checks that read the node say so; a plugin runs in its turn.
    beside_ranks: ClassVar[bool] = False

    def required_floors(self, profile: ResolvedProfile) -> tuple[str, ...]:
        """The floors a profile running this check must define."""
        return self.floors

    def applies(self, ctx: Context) -> str | None:
        """A reason to SKIP on this node, or None to run."""
        return None

    def ranks_wanted(self, ctx: Context) -> int | None:
        """How many local ranks this check's worker runs on in the run's shared launch
        (preflight.gpuwork.world), or None where it starts none. The run starts that launch
        as it begins, so torchrun and the torch imports overlap the checks before this one."""
        return None

    def begin(self, ctx: Context) -> None:
        """Called on every check of the plan as the run begins, before the first check runs: a
        check that measures over an interval takes its first reading here (into ctx.readings),
        so the interval runs beside the checks before it. It returns at once (a read that may
        block runs in a thread the check waits for within its own deadline); where it raises,
        the reading is dropped and the check takes its own at its turn."""

    @abstractmethod
    def run(self, ctx: Context) -> Result | Waiting:
        """Gather facts, judge them, return the verdict (or, built in, ``Waiting``)."""

    def result(self, status: Status, summary: str, **kw: Any) -> Result:
        return Result(check=self.name, status=status, summary=summary, **kw)

    def conclude(self, findings: list[Finding], ok_summary: str, **kw: Any) -> Result:
        """PASS with ``ok_summary`` if nothing was found; otherwise the worst
        status, led by the worst finding's summary, with every cause and remedy."""
        if not findings:
            return self.result(Status.PASS, ok_summary, **kw)
        ranked = sorted(findings, key=lambda f: SEVERITY.index(f.status), reverse=True)
        then = highest([f.next for f in ranked])
        assert then is not None  # findings is not empty
        kw = {"action": then.action, "domain": then.domain, "action_source": then.source, **kw}
        return self.result(
            ranked[0].status,
            ranked[0].summary + (f" (+{len(ranked) - 1} more)" if len(ranked) > 1 else ""),
            cause="; ".join(f.cause for f in ranked),
            # Remedies share clauses ("...; drain the node"): say each once.
            remedy="; ".join(dict.fromkeys(part for f in ranked for part in f.remedy.split("; "))),
            **kw,
        )
