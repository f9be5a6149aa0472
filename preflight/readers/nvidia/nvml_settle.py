"""Wait for the NVSwitch fabric to settle before judging the node: the run reads NVML again,
bounded, while any GPU's fabric registration is in progress.

A boot gate starts right after nvidia-fabricmanager reports active, and systemd's
"active" does not wait for the fabric to be trained: the GPUs' registration can
read IN_PROGRESS at 0.5 s and COMPLETED by 10 s, and on an NVSwitch board the
NVLinks are trained by the same manager. Judged on that first reading, a node
that is only settling FAILs (cuda on its NVLinks, topology, fabric). So the run
(pipeline/plan.py execute) waits here once, before the node's shape is read,
and every check judges the settled reading (``Waited``).

A fake inventory (--nvml-fake) or facts given to the run never change: they are
judged as they are. A read that fails meanwhile is the reader's trouble, not the
node's: the last reading stands and ``Settled.unread`` says why the wait stopped.
``settle`` is a pure loop over ``read``, ``clock`` and ``sleep``, tested without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from preflight.readers.nvidia import nvml
from preflight.readers.nvidia.nvml_facts import Inventory

# How long a run waits for registration to complete: the boot gate this is for saw
# IN_PROGRESS at 0.5 s and COMPLETED by 10 s (issue 34's review); 20 s gives that twice
# over and stays well inside fabric's and topology's 30 s. One still in progress then
# FAILs as before, its details saying how long it was given.
LIMIT_SECONDS = 20.0
EVERY_SECONDS = 1.0  # between reads: each costs a child and its 0.4 s window of clock readings
READ_TIMEOUT = 10.0  # one read's bound; the loop's limit bounds them all
LEAST_READ_SECONDS = 2.0  # a read's least time: the NVML child's start and its 0.4 s window, with room on 8 GPUs
MARGIN_SECONDS = 6.0  # left before the check's deadline for what it does after (systemctl's 5 s, the judge)


@dataclass
class Settled:
    inventory: Inventory  # the reading to judge: the last one made
    waited: float = 0.0  # seconds from the first reading to the last
    reads: int = 0  # readings made after the first
    unread: str | None = None  # why the wait stopped early: a read that failed
    limit: float | None = None  # the seconds it was given; None: nothing was in progress, no wait

    @property
    def pending(self) -> list[int]:
        """GPUs still registering in the reading judged."""
        return in_progress(self.inventory)

    def describe(self) -> str | None:
        """One sentence for details, or None where nothing was waited for."""
        if self.limit is None:
            return None
        if not self.reads and self.unread is None:
            return (f"fabric registration in progress on GPU {', '.join(map(str, self.pending))}; no time left before "
                    f"the check's deadline to read NVML again")
        now = (f"GPU {', '.join(map(str, self.pending))} still in progress" if self.pending
               else "every GPU's registration done")
        said = f"fabric registration was in progress; read NVML {self.reads} more time(s) over {self.waited:.1f} s: {now}"
        return said + (f"; the wait stopped: {self.unread}" if self.unread else "")


def in_progress(inv: Inventory) -> list[int]:
    return [g.index for g in inv.gpus if g.fabric is not None and g.fabric.state == "in_progress"]


def settle(first: Inventory, read: Callable[[float], Inventory], limit: float,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
           every: float = EVERY_SECONDS) -> Settled:
    """Read again (``read(timeout)``) every ``every`` seconds while any GPU is IN_PROGRESS,
    until none is or ``limit`` seconds have passed since the start; the last reading wins."""
    start = clock()
    out = Settled(first, limit=limit if in_progress(first) else None)
    while out.pending:
        left = limit - (clock() - start)
        if left <= 0:
            break
        sleep(min(every, left))
        left = limit - (clock() - start)
        if left <= 0:
            break
        given = min(READ_TIMEOUT, max(left, 1.0))
        try:
            out.inventory = read(given)
            out.reads += 1
        except nvml.NvmlUnavailable as e:
            # A read given little of the wait's end can run out on a healthy node: that is the limit, not the driver.
            out.unread = (f"the wait's limit came before NVML's next answer ({given:.1f} s left to read)" if given < LEAST_READ_SECONDS
                          else f"NVML did not answer a later read ({e.cause})") + "; the last reading is judged"
        out.waited = clock() - start
        if out.unread:
            break
    return out


class Waited(nvml.Shared):
    """The reading a check waited for, with how: the checks after it judge it without waiting again."""

    def __init__(self, settled: Settled):
        super().__init__(facts=settled.inventory)
        self.settled = settled


def wait(shared: nvml.Shared, limit: float, on_wait: Callable[[list[int]], None] = lambda _: None) -> nvml.Shared:
    """The run's reading, waited on (``limit`` seconds at most; none left: said so, not read again)
    where it is this node's NVML and any GPU's registration is in progress: a ``Waited`` that every
    check shares, else ``shared`` as it was. A reading that failed is left for the checks to name."""
    if isinstance(shared, Waited) or shared.fake is not None or shared.given:
        return shared
    try:
        first = shared.get()
    except nvml.NvmlUnavailable:
        return shared
    if not in_progress(first):
        return shared
    on_wait(in_progress(first))
    return Waited(settle(first, lambda t: nvml.inventory(None, t), limit, every=EVERY_SECONDS))
