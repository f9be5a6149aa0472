"""The processes around a launch, found through psutil: those that carry a launch's token
in their environment (the sweep after any outcome kills them, gpuwork/launch.py), the one
listening on a port, and each named in a few words for a cause.
"""

from __future__ import annotations

import os

import psutil

TOKEN_ENV = "PREFLIGHT_LAUNCH_TOKEN"


def port_holder(port: int) -> str:
    try:
        for c in psutil.net_connections("tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                return f" by pid {c.pid} ({process_name(psutil.Process(c.pid))})"
    except (psutil.Error, OSError):
        pass
    return ""


def marked(token: str, env: str = TOKEN_ENV) -> list[psutil.Process]:
    """Live processes whose environment carries ``env=token``: everything a launch
    (or `preflight selftest`'s stage) started, sessions of their own included."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE and p.environ().get(env) == token:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def process_name(p: psutil.Process) -> str:
    """The command line, short and on one line, for a cause."""
    try:
        words = " ".join(" ".join(p.cmdline()[:3]).split())
        return (words[:80] + "...") if len(words) > 80 else words or p.name()
    except psutil.Error:
        return "?"
