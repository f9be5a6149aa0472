"""From settings to a Report: pick the profile, select the checks, run them.

Everything that can be wrong with the input is found in ``plan`` and raised
as UsageError before a single check runs or a single file is written.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Protocol
from datetime import datetime, timezone

from preflight import __version__
from preflight.gpuwork import meeting, multinode, world
from preflight.readers.nvidia import nvml, nvml_settle
from preflight.pipeline import floor_bounds, levels, profile_detect, profiles, registry, shape
from preflight.pipeline.check import Check, Context, Result
from preflight.base.findings import Status
from preflight.base import interpreter_trust
from preflight.base.errors import UsageError
from preflight.base.host import Host
from preflight.base.progress import Progress
from preflight.pipeline.profile_detect import DetectionFailed
from preflight.pipeline.profiles import ResolvedProfile
from preflight.pipeline.report import Report, exit_code_of, read_previous, verdict_of, versions_of
from preflight.pipeline.runner import MAX_TIMEOUT, run_checks
from preflight.base.errors import Interrupted
from preflight.pipeline.settings import Settings


@dataclass
class Plan:
    profile: ResolvedProfile | None  # None when `auto` found nothing to pick
    checks: list[Check]
    detection_failure: DetectionFailed | None = None
    detection_seconds: float = 0.0
    group: multinode.Group | None = None  # nccl and bandwidth across these nodes
    side: multinode.LocalSide | None = None
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))  # detection counts
    level: str = levels.DEFAULT  # how deep the run looks (preflight/pipeline/levels.py), and why
    level_chosen_because: str = "the default level"
    # The run's one NVML inventory: read where it is first needed (detection, the shape, an
    # idle recheck) and handed to every check through the Context; None: execute makes one.
    inventory: nvml.Shared | None = None


def resolve_profile(settings: Settings, inventory: nvml.Shared | None = None) -> ResolvedProfile:
    """The profile named by the settings, with the site's floor overrides applied.
    ``inventory``: the run's NVML reading, which `auto` reads from.

    Raises DetectionFailed when `auto` finds no driver or no matching profile.
    """
    if settings.profile == "auto":
        name, why = profile_detect.detect(settings.profiles_dir, settings.nvml_fake, inventory)
    else:
        name, why = settings.profile, f"--profile {settings.profile}"
    path = profiles.find(name, settings.profiles_dir)
    return profiles.resolve(profiles.load(path), path, settings.floor_overrides, why)


def check_inputs(settings: Settings) -> None:
    """Paths the settings name must be usable before anything runs."""
    if settings.python is not None:
        p = settings.python
        where = f"python {p} (--python, PREFLIGHT_PYTHON or config)"
        if not p.exists():
            raise UsageError(f"{where}: no such file; point it at the training environment's interpreter, e.g. /opt/venv/bin/python")
        if p.is_dir() or not os.access(p, os.X_OK):
            raise UsageError(f"{where}: not an executable file; point it at the training environment's interpreter")
    if settings.nvml_fake is not None:
        nvml.FakeNvml(settings.nvml_fake)  # a malformed file names its field and exits 2


def check_python_trusted(settings: Settings) -> str | None:
    """As root, the workers' Python must be one no other user can change, unless the site
    accepts it (python_of_another_user): its owner would decide what root runs on the node.
    Returns why another user has a say in it where the site accepted that, else None."""
    python = str(settings.python) if settings.python is not None else sys.executable
    who = interpreter_trust.interpreter_steerable(shutil.which(python) or python) if os.geteuid() == 0 else None
    if who and not settings.python_of_another_user:
        raise UsageError(f"the workers' Python {python} would run as root, and another user decides what it does ({who}): "
                         "give root a Python no other user can change (chown root and chmod go-w it and the directories "
                         "above it), or set python_of_another_user = true in the config to run it anyway")
    return who


def gpus_busy(settings: Settings, inventory: nvml.Shared | None = None) -> str | None:
    """Why a recheck must not run now (a job holds a GPU), or None. A node whose
    NVML does not answer is not busy: the run goes ahead and names the fault.
    ``inventory``: the run's NVML reading (the plan's)."""
    try:
        return nvml.busy((inventory or nvml.Shared(settings.nvml_fake)).get())
    except nvml.NvmlUnavailable:
        return None


def plan(settings: Settings, reading: nvml.Shared | None = None) -> Plan:
    """``reading``: the run's NVML inventory, perhaps begun already (its child answering meanwhile)."""
    check_inputs(settings)
    # These may come from flags, PREFLIGHT_ONLY/SKIP or the config file: name all three.
    registry.check_names(settings.only, "only (--only, PREFLIGHT_ONLY or config):")
    registry.check_names(settings.skip, "skip (--skip, PREFLIGHT_SKIP or config):")
    both = sorted(set(settings.only) & set(settings.skip))
    if both:
        raise UsageError(f"only and skip both name {', '.join(both)}; name each check in one of them")
    started_at, started = datetime.now(timezone.utc), time.monotonic()
    inventory = reading if reading is not None else nvml.Shared(settings.nvml_fake)
    if inventory.pending:
        registry.preload()  # while NVML's child answers, not after
    try:
        profile = resolve_profile(settings, inventory)
    except DetectionFailed as e:
        asked = levels.choose(settings.level, None, {})  # a budget needs a profile's levels to weigh
        return Plan(None, [], e, time.monotonic() - started, started_at=started_at, level=asked[0], level_chosen_because=asked[1],
                    inventory=inventory)
    registry.check_names(profile.checks, f"profile {profile.name} ({profile.path}) lists check")
    previous = read_previous(settings.report) if settings.budget is not None else None
    level, why = levels.pick(profile, settings.level, settings.budget, settings.only, settings.skip, previous, settings.report)
    at_level = levels.checks_at(profile.levels, profile.checks, level, profile.name)
    settings.level = level  # the level this run looks at, for the checks (ctx.settings.level)
    outside = [c for c in settings.only if c not in at_level]
    if outside:
        if all(c in profile.checks for c in outside):
            raise UsageError(f"only {', '.join(outside)}: not at level {level} ({why}) of profile {profile.name}, whose checks there are {', '.join(at_level)}; name a deeper level with --level")
        raise UsageError(f"only {', '.join(outside)}: not in profile {profile.name} (its checks: {', '.join(profile.checks)})")
    selected = select(profile, level, settings)
    if not selected:
        # A gate that checks nothing must not pass: this is a config mistake.
        at = "" if at_level == profile.checks else f" at level {level}"
        raise UsageError(f"no check left to run: skip removes every check of profile {profile.name}{at} ({', '.join(at_level)})")
    checks = [registry.load(name) for name in selected]
    position = {name: i for i, name in enumerate(profile.checks)}
    for check in checks:
        for req in check.requires:
            if position.get(req, -1) > position[check.name]:
                raise UsageError(
                    f"profile {profile.name} ({profile.path}) lists {check.name} before {req}, which it requires; put {req} first"
                )
        missing = [f for f in check.required_floors(profile) if f not in profile.floors]
        if missing:
            raise UsageError(
                f"profile {profile.name} ({profile.path}) has no floor {missing[0]!r}, which check {check.name} needs; "
                "add it to the profile"
            )
        for name, (unit, bound) in check.floor_units.items():
            floor = profile.floors.get(name)
            if floor is not None and (floor.unit, floor.bound) != (unit, bound):
                said = f"unit {floor.unit!r}, bound {floor.bound!r}"
                raise UsageError(
                    f"profile {profile.name} ({profile.path}): floor {name!r} has {said}, but check {check.name} measures it "
                    f"in {unit!r} with bound {bound!r}; write it in {unit} (48 GB/s is 48e9 bytes_per_second, 80 us is 8e-05 seconds)"
                )
    _known_floors(profile, checks)
    group, side = _group(settings, selected)
    return Plan(profile, checks, started_at=started_at, group=group, side=side, level=level, level_chosen_because=why, inventory=inventory)


def select(profile: ResolvedProfile, level: str, settings: Settings) -> list[str]:
    """The profile's checks at ``level`` that --only and --skip leave, in the profile's order."""
    at_level = levels.checks_at(profile.levels, profile.checks, level, profile.name)
    return [c for c in at_level if (not settings.only or c in settings.only) and c not in settings.skip]


def seconds_at_most(plan: Plan, settings: Settings) -> float:
    """The longest the plan's checks may take, each to its deadline, and a group's
    meetings: a run not done by then is not coming back (outputs/record/run_record.py)."""
    if plan.profile is None:
        return 0.0
    checks = sum(min(plan.profile.timeouts.get(c.name, c.timeout_seconds), MAX_TIMEOUT) for c in plan.checks)
    settling = nvml_settle.LIMIT_SECONDS + nvml_settle.READ_TIMEOUT if plan.profile.has_gpus else 0.0  # execute's wait for the fabric
    return checks + settling + (3 * settings.rdzv_timeout + 2 * meeting.BYE if plan.group else 0.0)


def _group(settings: Settings, selected: list[str]) -> tuple[multinode.Group | None, multinode.LocalSide | None]:
    group = multinode.of(settings.nnodes, settings.node_rank, settings.rdzv_endpoint, settings.rdzv_id)
    if group is None:
        return None, None
    if meeting.GROUP_CHECKS[0] not in selected:
        raise UsageError(f"--nnodes {group.nnodes}: the group meets for the nccl check, which this run leaves out; select nccl (and bandwidth), or run each node alone without --nnodes")
    return group, multinode.local_side(group, settings.rdzv_timeout)


def _known_floors(profile: ResolvedProfile, selected: list[Check]) -> None:
    """Every floor must be one some installed check reads: a misspelt name would never be judged.
    A plugin that fails to load cannot say which it reads, so then no name is refused.
    Every floor must judge something (``_sane_floors``)."""
    known: set[str] = set()
    sane: dict[str, floor_bounds.Sane] = {}
    broken = False
    loaded = {c.name: c for c in selected}
    for name in registry.names():
        check = loaded.get(name) or registry.load(name)
        if isinstance(check, registry.BrokenPlugin):
            broken = True
            continue
        known |= set(check.floors) | set(check.floor_units) | set(check.required_floors(profile))
        sane.update(check.floor_sane)
    stray = sorted(set(profile.floors) - known)
    if stray and not broken:
        f = profile.floors[stray[0]]
        raise UsageError(f"{f.origin}: floor {stray[0]!r} is read by no installed check; known floors: {', '.join(sorted(known))}")
    _sane_floors(profile, sane)


def _sane_floors(profile: ResolvedProfile, sane: dict[str, floor_bounds.Sane]) -> None:
    """A floor of 0, or one so low (a ceiling so high) that it judges nothing, turns its check off unseen: refused."""
    for name, f in profile.floors.items():
        if why := floor_bounds.problem(f.value, f.unit, f.bound, sane.get(name)):
            raise UsageError(f"{f.origin}: floor {name!r} {why}")


def read_shape(settings: Settings, host: Host, reading: nvml.Shared | None = None) -> shape.NodeShape:
    """The node's shape (preflight.pipeline.shape), from ``reading`` (the run's NVML inventory) where
    given. NVML may be silent: the shape is then read from sysfs and /dev alone, and the cuda
    check names NVML's fault."""
    try:
        inventory, why = (reading or nvml.Shared(settings.nvml_fake)).get(), None
    except nvml.NvmlUnavailable as e:
        inventory, why = None, e.cause
    found = shape.gather(host, inventory, settings.node_gpus, why)
    n = settings.nproc_per_node
    if n and found.gpus and n > found.gpus:
        where = f"nproc_per_node {n} (--nproc-per-node, PREFLIGHT_NPROC_PER_NODE or config)"
        raise UsageError(f"{where}: this node gives the run {found.gpus} GPU(s) ({found.gpus_from}), and torchrun starts one rank per GPU; give at most {found.gpus}")
    return found


class Display(Protocol):
    """Where a run shows itself while it goes (preflight.outputs.exporters.console.Console
    for a person): the pipeline tells it, and never imports an output."""

    progress: Progress

    def start(self, check: Check) -> None: ...
    def finish(self, result: Result) -> None: ...
    def note(self, text: str) -> None: ...


def _detection_result(e: DetectionFailed, seconds: float) -> Result:
    return Result(
        check="profile",
        status=Status.FAIL,
        summary=f"no profile chosen: {e.cause}",
        cause=e.cause,
        remedy=e.remedy,
        duration_seconds=round(seconds, 6),
    )


def execute(plan: Plan, settings: Settings, console: Display, host: Host | None = None, worlds: world.Worlds | None = None) -> Report:
    """Run the plan's checks into a Report. ``worlds``: the run's launches, one perhaps
    started ahead of the plan (pipeline/head_start.py); kept where the checks want it,
    and closed, whatever happened, before this returns."""
    host = host or Host()
    started = plan.started_at
    interrupted = None
    group = None
    node_shape = None
    if plan.detection_failure is not None:
        results = [_detection_result(plan.detection_failure, plan.detection_seconds)]
        console.finish(results[0])
    else:
        assert plan.profile is not None
        reading = plan.inventory or nvml.Shared(settings.nvml_fake)
        if plan.profile.has_gpus:
            # A fabric still registering (a boot gate right after the fabric manager started) is
            # waited for once, before the shape, so cuda, topology and fabric judge the settled node.
            said = lambda gpus: console.note(f"NVSwitch fabric registration in progress on GPU {', '.join(map(str, gpus))}: "  # noqa: E731
                                             f"waiting up to {nvml_settle.LIMIT_SECONDS:g} s for it")
            try:
                reading = nvml_settle.wait(reading, nvml_settle.LIMIT_SECONDS, said)
            except Interrupted as sig:  # up to ~20 s: the report still says every check was cut short
                interrupted = sig.signum
        ctx = Context(profile=plan.profile, settings=settings, host=host, progress=console.progress, worlds=worlds if worlds is not None else world.Worlds(),
                      shared_inventory=reading)
        if plan.profile.has_gpus:
            ctx.shape = node_shape = read_shape(settings, host, reading)
            console.note(f"node: {node_shape.describe()}")
        console.note(f"level {plan.level}: {plan.level_chosen_because}")  # after the shape: bad input says one line alone
        if plan.group and plan.side:
            budget = sum(min(plan.profile.timeouts.get(c.name, c.timeout_seconds), 3600) for c in plan.checks) + 3 * settings.rdzv_timeout + 2 * meeting.BYE
            python = str(settings.python) if settings.python else sys.executable
            ctx.meeting = meeting.Meeting(plan.group, plan.side, python, budget)
        if not plan.group:  # a launch across nodes waits for its meeting
            wanted = next((n for c in plan.checks if (n := c.ranks_wanted(ctx))), None)
            if wanted:
                ctx.worlds.prestart(str(settings.python) if settings.python else sys.executable, wanted, settings.rdzv_port)
            else:
                ctx.worlds.close()  # a head start the plan does not want: its ranks hold no GPU yet
        try:
            outcome = run_checks(
                plan.checks,
                ctx,
                keep_going=settings.keep_going,
                timeouts=plan.profile.timeouts,
                on_start=console.start,
                on_finish=console.finish,
                before=lambda check: meeting.gate(ctx, check),
                interrupted_by=interrupted,
            )
            results, interrupted = outcome.results, outcome.interrupted_by
            if ctx.meeting and not interrupted:
                try:
                    group = meeting.finish(ctx, results)
                except Interrupted as sig:  # the checks ran: their report is still written
                    interrupted = sig.signum
                if group and not group["passed"]:
                    # The last meeting may have named a peer after the checks were printed.
                    console.note("group: " + meeting.verdict_line(group))
        finally:
            ctx.worlds.close()  # the ranks' launches end with the run, whatever happened
            if ctx.meeting and ctx.meeting.host:  # interrupted: the store goes with the run
                ctx.meeting.host.wait(lambda _: True)
    finished = datetime.now(timezone.utc)
    verdict = verdict_of(results, interrupted)
    return Report(
        version=__version__,
        hostname=host.hostname(),
        boot_id=host.boot_id(),
        profile=plan.profile.name if plan.profile else None,
        profile_chosen_because=plan.profile.chosen_because if plan.profile else None,
        config=str(settings.config) if settings.config else None,
        started_at=started,
        finished_at=finished,
        duration_seconds=round((finished - started).total_seconds(), 6),
        verdict=verdict,
        exit_code=exit_code_of(verdict, interrupted),
        keep_going=settings.keep_going,
        interrupted_by_signal=interrupted,
        versions=versions_of(results),
        group=group,
        shape=node_shape,
        checks=results,
    )
