"""What to do about a finding: one ordered ladder a fleet's automation acts on, and
who owns the fault.

Prose (a cause, a remedy) is for people; automation needs a word it can switch on.
The ladder is the escalation the field uses: NVIDIA's Xid catalog gives each Xid a
"Resolution Bucket" (RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT, ...,
docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), NVML a recovery action
per GPU (none, GPU reset, node reboot, drain and reset), and NVIDIA Health Validation
an escalation chain drain -> reset_gpu -> restart_os -> service_required. The domain
says whose fault it is (Nebius soperator prefixes its Slurm drain reasons the same
way), so automation replaces hardware and leaves a job's settings to the job's owner.

A finding that names no action gets its status's (``default_for``): a FAIL drains the
node for a person to look at, a WARN is watched. A run's action is the highest of its
findings' (``highest``); between two of the same rank the node's domain wins, then
software's, then the job's: the more a fault costs to leave, the more it decides.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import NamedTuple


class Action(str, Enum):
    NONE = "none"  # nothing found
    WATCH = "watch"  # a note: nothing to do now, look again if it recurs
    FIX_JOB = "fix-job"  # the job's environment or settings (NCCL variables, a container's /dev/shm): the node is fine
    DRAIN = "drain"  # take no new jobs; a person investigates
    RESET_GPU = "reset-gpu"  # nvidia-smi -r (or the driver's own recovery) once the GPU is idle
    REBOOT = "reboot"  # the node (or the VM) restarted
    SERVICE = "service"  # hardware: replace, RMA, the vendor's support

    def __str__(self) -> str:
        return self.value


LADDER = list(Action)  # lowest first: the order automation escalates in


class Domain(str, Enum):
    NODE = "node"  # the hardware and its firmware as the vendor ships it
    SOFTWARE = "software"  # driver, fabric manager, the node's configuration
    JOB = "job"  # what the job (or its container) brings: the node is fine

    def __str__(self) -> str:
        return self.value


_DOMAIN_WEIGHT = [Domain.JOB, Domain.SOFTWARE, Domain.NODE]  # the tie-break, least first


# A NamedTuple, not a dataclass: `preflight status` reads actions from the report and must not
# pay for importing dataclasses (see pipeline/report_view.py).
class Next(NamedTuple):
    """An action, whose fault it is, and where that comes from (a catalog, NVML, a rule)."""

    action: Action
    domain: Domain
    source: str

    def rank(self) -> tuple[int, int]:
        return LADDER.index(self.action), _DOMAIN_WEIGHT.index(self.domain)


# By status, for a finding or result that names no action of its own. SKIP and PASS ask nothing.
# ERROR is preflight's own failure to judge: the gate fails closed, so the node is drained for a
# person, and the domain is software (preflight, its plugins, its Python), never the hardware.
_DEFAULTS = {
    "PASS": Next(Action.NONE, Domain.NODE, "nothing found"),
    "SKIP": Next(Action.NONE, Domain.NODE, "not judged"),
    "WARN": Next(Action.WATCH, Domain.NODE, "a warning: watched, nothing to do now"),
    "FAIL": Next(Action.DRAIN, Domain.NODE, "a failure with no more specific action: drained for a person to investigate"),
    "ERROR": Next(Action.DRAIN, Domain.SOFTWARE, "preflight could not judge this check: the gate fails closed"),
}


def default_for(status: str) -> Next:
    """The action a status asks for where nothing more specific is known."""
    return _DEFAULTS[str(status)]


def highest(nexts: list[Next]) -> Next | None:
    """The one that decides: the highest action, the node's domain first on a tie,
    the first given between equals. None for none given."""
    best: Next | None = None
    for n in nexts:
        if best is None or n.rank() > best.rank():
            best = n
    return best


NOTHING = Next(Action.NONE, Domain.NODE, "nothing to do")


def decide(by_check: list[tuple[Next, str]]) -> tuple[Next, str | None]:
    """A run's action from its checks' (each with the check's name): the highest, and the
    check it came from; NOTHING and None where no check asks for anything."""
    best = highest([n for n, _ in by_check])
    if best is None or best.action == Action.NONE:
        return NOTHING, None
    return best, next(check for n, check in by_check if n is best)


def takes_out(n: Next) -> bool:
    """Whether ``n`` asks that the node take no jobs (a drain or more). A passing run can ask it
    only through its history: a lemon (outputs/record/history_judge.py) is `service` though it passed,
    and the schedulers' integrations take it out as they would a failure (within the cap)."""
    return LADDER.index(n.action) >= LADDER.index(Action.DRAIN)


def cap_allows(share: float, nodes: int) -> int:
    """How many of ``nodes`` preflight may hold out of service at once (Slurm's drains, Kubernetes'
    taints): ``share`` of them, at least one, so a small pool can still drain a bad node. The
    epsilon keeps 0.3 x 10 at 3, as a person reads it, not 2 (float rounding)."""
    return max(1, math.floor(share * nodes + 1e-9))


def drain_prefix(n: Next) -> str:
    """What a scheduler's drain reason starts with, so site automation can act on the
    prefix alone: ``preflight [node] reset-gpu``."""
    return f"preflight [{n.domain}] {n.action}"
