"""Slurm's configured GPUs against the node's: a node whose Gres names more GPUs than
it has gets jobs it cannot run; one with fewer leaves GPUs idle.

`scontrol show node` prints the node's generic resources as ``Gres=`` (``gpu:8``,
``gpu:h100:8``, ``gpu:h100:8(S:0-1)``, several comma-separated, ``(null)`` for none);
the GPUs are the sum over every ``gpu`` entry. A node whose Gres names no GPU at all
is not judged: many sites give whole nodes and never configure GPUs in Slurm.

Which side is wrong decides the action. More configured than present: the node lost
a GPU since Slurm was configured for it (off the bus, fallen out of the driver); the
run's own checks (cuda, the shape) will most likely have said so too, and the hardware
goes to service. More present than configured: the node is fine and slurm.conf or
gres.conf is out of date, a software fault: drain until an admin fixes the config.
"""

from __future__ import annotations

import re

from preflight.base.actions import Action, Domain, Next

CHECK = "slurm-gres"  # the name the drain reason gives, so the resume rule knows what to look at again
_ENTRY = re.compile(r"(?P<name>[A-Za-z0-9_]+)(?::(?P<type>[^:(]+))?(?::(?P<count>\d+)(?P<suffix>[KMG]?))?(?:\([^)]*\))?")
_SCALE = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
LOST = Next(Action.SERVICE, Domain.NODE, "Slurm's Gres names more GPUs than the node has: the node lost a GPU")
STALE_CONFIG = Next(Action.DRAIN, Domain.SOFTWARE, "the node has more GPUs than Slurm's Gres names: slurm.conf or gres.conf is out of date")


class GresError(ValueError):
    pass


def _entries(text: str) -> list[str]:
    """Split on the commas between entries, not those inside "(S:0,1)"."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [e for e in out if e]


def configured_gpus(gres: str | None) -> int | None:
    """The GPUs a ``Gres=`` value names; None where it names none (unset, ``(null)``)."""
    if gres is None or gres in ("(null)", "", "none"):
        return None
    total, any_gpu = 0, False
    for entry in _entries(gres):
        m = _ENTRY.fullmatch(entry)
        if m is None:
            raise GresError(f"Gres={gres}: cannot read {entry!r}")
        if m["name"] != "gpu":
            continue
        any_gpu = True
        # "gpu:h100" without a count: the type may itself be a number ("gpu:8" reads as a count).
        count = m["count"] if m["count"] is not None else (m["type"] if m["type"] and m["type"].isdigit() else "1")
        total += int(count) * _SCALE[m["suffix"] or ""]
    return total if any_gpu else None


def judge(gres: str | None, present: int | None) -> tuple[Next, str] | None:
    """The action and the cause where Slurm's GPUs differ from the node's; None where they agree or cannot be compared."""
    configured = configured_gpus(gres)  # GresError: a form this reader does not know, the caller says so and judges nothing
    if configured is None or present is None or configured == present:
        return None
    said = f"{CHECK} FAIL: Slurm's Gres says {configured} GPU{'s' * (configured != 1)}, the node has {present}"
    return (LOST, said) if configured > present else (STALE_CONFIG, said)
