"""Wait for the NVSwitch fabric to settle before judging it: what fabric and topology share.

A boot gate starts right after nvidia-fabricmanager reports active, and systemd's
"active" does not wait for the fabric to be trained: the GPUs' registration can
read IN_PROGRESS at 0.5 s and COMPLETED by 10 s, and on an NVSwitch board the
NVLinks are trained by the same manager. Judged on that first reading, a node
that is only settling FAILs. So where any GPU reads IN_PROGRESS the inventory is
read again about once a second, bounded, until none does; the last reading is
judged, and handed to the rest of the run (Context.shared_inventory) so every
later check judges the settled node too.

A fake inventory (--nvml-fake) never changes: it is judged as it is. A read that
fails meanwhile is the reader's trouble, not the node's: the last reading stands
and ``Settled.unread`` says why the wait stopped. ``settle`` is a pure loop over
``read``, ``clock`` and ``sleep``, tested without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from preflight.pipeline.check import Context
from preflight.readers import nvml
from preflight.readers.nvml import Inventory

# How long a run waits for registration to complete: the boot gate this is for saw
# IN_PROGRESS at 0.5 s and COMPLETED by 10 s (issue 34's review); 20 s gives that twice
# over and stays well inside fabric's and topology's 30 s. One still in progress then
# FAILs as before, its details saying how long it was given.
LIMIT_SECONDS = 20.0
EVERY_SECONDS = 1.0  # between reads: each costs a child and its 0.4 s window of clock readings
READ_TIMEOUT = 10.0  # one read's bound; the loop's limit bounds them all
# Left before the check's deadline for what it does after: host.RESERVE_SECONDS (3 s) for the fallback and
# the judges, and 3 s for a tool (nvidia-smi topo -m, systemctl), each of which answers in well under that.
MARGIN_SECONDS = 6.0


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
        try:
            out.inventory = read(min(READ_TIMEOUT, max(left, 1.0)))
            out.reads += 1
        except nvml.NvmlUnavailable as e:
            out.unread = f"NVML did not answer a later read ({e.cause}); the last reading is judged"
        out.waited = clock() - start
        if out.unread:
            break
    return out


class _Waited(nvml.Shared):
    """The reading a check waited for, with how: the checks after it judge it without waiting again."""

    def __init__(self, settled: Settled):
        super().__init__(facts=settled.inventory)
        self.settled = settled


def settled_inventory(ctx: Context, timeout: float) -> Settled:
    """The run's inventory, waited on while any GPU's fabric registration is in progress (real
    NVML only), within ``LIMIT_SECONDS`` and the check's deadline less ``MARGIN_SECONDS``; once a
    run, so fabric after topology waits no second time. The reading waited for replaces the run's
    shared one. Raises NvmlUnavailable as Context.inventory."""
    first = ctx.inventory(timeout=timeout)
    shared = ctx.shared_inventory
    if isinstance(shared, _Waited):
        return shared.settled
    # A fake, or facts given to the run (a report built from a recording), never change: judged as they are.
    if ctx.settings.nvml_fake is not None or (shared is not None and shared.given) or not in_progress(first):
        return Settled(first)
    limit = min(LIMIT_SECONDS, ctx.deadline - time.monotonic() - MARGIN_SECONDS)
    out = settle(first, lambda t: nvml.inventory(None, t), limit, every=EVERY_SECONDS)
    ctx.shared_inventory = _Waited(out)
    return out
