"""NVML's child (nvml_query.py), started: ``start`` for every reading, and ``early`` for
`preflight run`'s, begun before the run imports the rest of preflight.

The child answers in about 0.6 s on an H200, most of it its 0.4 s window of clock
readings, and the agent's own imports (pydantic, the settings, the gate and the checks)
take about as long before the run can begin anything. A quick level, which waits for
nothing else, is the two one after the other unless the child starts first. This module
imports only the host seam, so the CLI can start the child as its first act.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from preflight.base.host import Host, Started


def start(what: str) -> Started:
    """nvml_query's child for ``what`` (inventory, pcie, sample), started."""
    # cwd "/": `python -m` puts the working directory first on sys.path, and a
    # pynvml.py lying there must not run as root.
    return Host().start([sys.executable, "-m", "preflight.readers.nvidia.nvml_query", what], cwd="/")


def early(profile: str | None, fake: Path | None, environ: Mapping[str, str] = os.environ) -> Started | None:
    """The inventory's child, started now where the run will surely read this node's NVML: no
    fake NVML given (flag or environment) and no profile named but `auto` (flag or environment),
    since a named profile may have no GPUs and is known only once loaded: the head start then
    starts the child as before. Whoever gets one hands it to the run's reading (``nvml.Shared``),
    which ends it however the run ends; a config file that names a fake or a profile without
    GPUs only costs a child stopped unread."""
    # pydantic-settings matches PREFLIGHT_* whatever their case.
    env = {k.upper(): v for k, v in environ.items() if k.upper() in ("PREFLIGHT_PROFILE", "PREFLIGHT_NVML_FAKE")}
    named = profile if profile is not None else env.get("PREFLIGHT_PROFILE")
    if fake is not None or env.get("PREFLIGHT_NVML_FAKE") or (named is not None and named.strip().lower() != "auto"):
        return None
    try:
        return start("inventory")
    except OSError:
        return None  # the reading starts it again where it is asked, and says why it cannot
