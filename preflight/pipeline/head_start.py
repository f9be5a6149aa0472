"""The ranks' launch started before the plan reads NVML: a head start for the torch imports.

A launch of ranks begins with torchrun's and every rank's torch import, seconds on a
GPU node, which a bare torchrun pays from its first instant. The plan reads NVML first
(a child of about 0.6 s on an H200) and then the node's shape; a launch started only
after them adds both to the run. So where the launch the plan will want can be told
from what is at hand before NVML answers (the settings, a profile named by the person,
the GPUs that sysfs and /dev show: the count the shape takes where NVML is silent), the
run starts it first, and execute adopts it where the plan wants that very launch (same
interpreter, ranks and port: gpuwork.world.Worlds.prestart) or ends it and starts its own.

The ranks import torch and wait for a stage: no CUDA work, so no GPU is touched before
the run holds its lock. Nothing starts early where the guess could touch what the person
did not ask for: a run across nodes, a level a budget picks, a periodic recheck
(--if-idle must see the GPUs idle first), a fake NVML (a test's stand-in GPUs), another
run holding the lock (the caller asks), or a selection of checks none of which starts ranks.
"""

from __future__ import annotations

from preflight.base.errors import UsageError
from preflight.base.host import Host
from preflight.pipeline import levels, profiles, registry, shape
from preflight.pipeline.check import Check
from preflight.pipeline.settings import Settings


def ranks(settings: Settings, host: Host | None = None) -> int | None:
    """The local ranks of the launch this run's plan will want, as Context.ranks will count
    them, where that can be told before the plan; None where it cannot, or none is wanted."""
    if settings.nnodes > 1 or settings.budget is not None or settings.nvml_fake is not None:
        return None
    level = settings.level or levels.DEFAULT
    if level == "quick":
        return None  # no torch and no GPU work (the cuda check starts no ranks there)
    if settings.only and not any(_starts_ranks(name) for name in settings.only):
        return None
    asked = settings.nproc_per_node
    if settings.profile != "auto":
        try:
            profile = profiles.load(profiles.find(settings.profile, settings.profiles_dir))
            at_level = levels.checks_at(profile.levels, profile.checks, level, profile.name)
        except (UsageError, OSError, ValueError):
            return None  # the plan says what is wrong with it, in one line
        if not any(_starts_ranks(name) for name in at_level if name not in settings.skip):
            return None
        named = profile.nccl.ranks if profile.nccl else None
        if not profile.has_gpus:
            return asked or named or 1
        if asked or named:
            return asked or named
    gpus = shape.gather(host or Host(), None, settings.node_gpus, "not read yet").gpus
    return asked or gpus or None


def reads_nvml(settings: Settings) -> bool:
    """Whether the plan or the run reads this node's NVML: a profile found by it (auto) or one
    with GPUs. Where it does, the run begins the reading first (nvml.Shared.begin)."""
    if settings.nvml_fake is not None:
        return False  # a fake file is read where it is asked for
    if settings.profile == "auto":
        return True
    try:
        return profiles.load(profiles.find(settings.profile, settings.profiles_dir)).has_gpus
    except (UsageError, OSError, ValueError):
        return False  # the plan says what is wrong with it


def _starts_ranks(name: str) -> bool:
    """Whether the check ``name`` has ranks of the shared launch (cuda, nccl, bandwidth, train, ...)."""
    try:
        return type(registry.load(name)).ranks_wanted is not Check.ranks_wanted
    except UsageError:
        return False  # an unknown name: the plan refuses it
