"""What a run starts before its plan: NVML's reading and the ranks' launch.

The plan reads NVML first (a child of about 0.6 s on an H200; `preflight run` begins it as its
first act where it surely will read it, readers/nvidia/nvml_child.early), and a launch of ranks
begins with torchrun's and every rank's torch import, seconds on a GPU node, which a
bare torchrun pays from its first instant. Started only after the plan, both add to
the run. So the run begins NVML's child at once where it will read NVML, and starts
the launch of ranks where the one the plan will want can be told from what is at hand
before NVML answers: the settings, a profile named by the person (its checks asked
through a provisional Context, as execute asks them), and the GPUs that sysfs and /dev
show, the count the shape takes where NVML is silent. execute adopts that launch where
the plan wants it (same interpreter, ranks and port: gpuwork.world.Worlds.prestart) and
ends it otherwise.

The launch starts only under the run lock, taken now where it is free (held, the run
waits for it after the plan as before and starts nothing early): the lock is inherited
by everything the run starts, and no other run's GPUs see this one's ranks. Its ranks
import torch and wait for a stage: no CUDA work before a check's. Nothing starts early
for a run across nodes, a level a budget picks, a periodic recheck (--if-idle must see
the GPUs idle first), a fake NVML (a test's stand-in GPUs), or a selection of checks
none of which has ranks.
"""

from __future__ import annotations

from contextlib import ExitStack

from preflight.base.errors import UsageError
from preflight.base.host import Host, Started
from preflight.gpuwork import multinode, world
from preflight.pipeline import levels, plan as planning, registry, shape
from preflight.pipeline.check import Check, Context
from preflight.pipeline.lock import LockHeld, run_lock
from preflight.pipeline.profiles import ResolvedProfile
from preflight.pipeline.settings import Settings
from preflight.readers.nvidia import nvml


class HeadStart:
    """The run's NVML reading, launches and, where it took it early, its lock: begun by
    ``begin``, handed to the plan and execute, ended by ``close`` however the run ends."""

    def __init__(self, settings: Settings, early: Started | None = None):
        """``early``: NVML's child the CLI began before the settings were read (nvml_child.early)."""
        self.reading = nvml.Shared(settings.nvml_fake, started=early)
        self.worlds = world.Worlds()
        self.locked = False  # the run lock is held from here to ``close``
        self.found_held = False  # another run took the lock between the run's look and the head start
        self._lock = ExitStack()

    def begin(self, settings: Settings, python: str, ranks_too: bool, host: Host | None = None) -> None:
        """NVML's child, and with ``ranks_too`` (no --if-idle, no other run seen holding the
        lock) the ranks' launch under the run lock, where either is wanted."""
        n = ranks(settings, host) if ranks_too else None
        if n:
            try:
                self._lock.enter_context(run_lock(settings.lock_file, 0))
                self.locked = True
            except LockHeld:
                self.found_held = True  # taken meanwhile: this run waits for it after the plan, as it would have
        if reads_nvml(settings):
            self.reading.begin()  # it answers while the ranks start and the plan loads the checks (begun already where early)
        elif self.reading.pending:
            self.reading.close()  # begun early for a profile the config names, which reads no NVML
        if self.locked and n:
            self.worlds.prestart(python, n, settings.rdzv_port)

    def close(self) -> None:
        """The ranks, then NVML's child, then the lock: nothing of the run outlives its lock."""
        with ExitStack() as stack:  # each step runs whatever the one before raised (a second signal)
            stack.callback(self._lock.close)
            stack.callback(self.reading.close)
            stack.callback(self.worlds.close)


def reads_nvml(settings: Settings) -> bool:
    """Whether the plan or the run reads this node's NVML: a profile found by it (auto) or one
    with GPUs."""
    if settings.nvml_fake is not None:
        return False  # a fake file is read where it is asked for
    if settings.profile == "auto":
        return True
    named = _named(settings)
    return named is not None and named.has_gpus


def ranks(settings: Settings, host: Host | None = None) -> int | None:
    """The local ranks of the launch this run's plan will want (execute's ``ranks_wanted`` of
    its first check that has ranks), where that can be told before the plan; None where it
    cannot, or none is wanted."""
    try:
        group = multinode.of(settings.nnodes, settings.node_rank, settings.rdzv_endpoint, settings.rdzv_id)
    except UsageError:
        return None  # the plan says why
    if group is not None or settings.budget is not None or settings.nvml_fake is not None:
        return None
    level = settings.level or levels.DEFAULT
    if level == "quick":
        return None  # no torch and no GPU work (the cuda check starts no ranks there)
    host = host or Host()
    if settings.profile == "auto":
        # The profile is NVML's to find: one rank per GPU sysfs and /dev show, or the person's count.
        candidates = settings.only or registry.names()
        if not any(_has_ranks(name) for name in candidates if name not in settings.skip):
            return None
        return settings.nproc_per_node or shape.gather(host, None, settings.node_gpus, "not read yet").gpus or None
    profile = _named(settings)
    if profile is None:
        return None
    try:
        selected = planning.select(profile, level, settings)
    except UsageError:
        return None  # the plan says what is wrong with it, in one line
    ctx = Context(profile=profile, settings=settings, host=host)
    if profile.has_gpus:
        ctx.shape = shape.gather(host, None, settings.node_gpus, "not read yet")
    for name in selected:
        try:
            if wanted := registry.load(name).ranks_wanted(ctx):
                return wanted
        except Exception:  # noqa: BLE001 - a broken check is the plan's to report
            return None
    return None


def _named(settings: Settings) -> ResolvedProfile | None:
    """The profile the person named (no NVML asked), or None where the plan must say what is wrong with it."""
    try:
        return planning.resolve_profile(settings)
    except (UsageError, OSError, ValueError):
        return None


def _has_ranks(name: str) -> bool:
    """Whether the check ``name`` has ranks of the shared launch (cuda, nccl, bandwidth, train, ...)."""
    try:
        return type(registry.load(name)).ranks_wanted is not Check.ranks_wanted
    except UsageError:
        return False  # an unknown name: the plan refuses it
