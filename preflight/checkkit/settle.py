"""The checks' side of the fabric wait (preflight/readers/nvidia/nvml_settle.py): the run waits once,
before the node's shape is read; a check that judges the fabric (fabric, topology's NVLinks)
asks again here, within its own deadline, where the run could not (facts handed to a Context
without a plan, as a test or the report builder does) and says in its details how long the run
waited."""

from __future__ import annotations

import time

from preflight.pipeline.check import Context
from preflight.readers.nvidia import nvml_settle
from preflight.readers.nvidia.nvml_settle import EVERY_SECONDS, LIMIT_SECONDS, READ_TIMEOUT, Settled, Waited, in_progress, settle  # noqa: F401 (the checks' names)

# Left before the check's deadline for what it does after: host.RESERVE_SECONDS (3 s) for the fallback and
# the judges, and 3 s for a tool (nvidia-smi topo -m, systemctl), each of which answers in well under that.
MARGIN_SECONDS = 6.0


def settled_inventory(ctx: Context, timeout: float) -> Settled:
    """The run's inventory, waited on while any GPU's fabric registration is in progress (real
    NVML only), within ``LIMIT_SECONDS`` and the check's deadline less ``MARGIN_SECONDS``; once a
    run, so a check after another (or after the run's own wait) waits no second time. The reading
    waited for replaces the run's shared one. Raises NvmlUnavailable as Context.inventory."""
    first = ctx.inventory(timeout=timeout)
    shared = ctx.shared_inventory
    if not isinstance(shared, Waited) and shared is not None:
        ctx.shared_inventory = shared = nvml_settle.wait(shared, min(LIMIT_SECONDS, ctx.deadline - time.monotonic() - MARGIN_SECONDS))
    return shared.settled if isinstance(shared, Waited) else Settled(first)
