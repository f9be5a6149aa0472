"""The rank's side of preflight/base/tether.py: a worker process dies with the process
that started it and with the agent, so nothing of a killed run lives on.

Standard library only, beside the workers (imported as ``_tether`` by ``_rank``, under
any interpreter, with or without preflight installed).
"""

from __future__ import annotations

import os
import signal
import time


def tie() -> None:
    """Both ties, at import of the first worker module; nothing for a worker run by hand."""
    _die_with_launcher()
    _watch_agent()


def _die_with_launcher() -> None:
    """A rank dies with the process that started it (torchrun), as torchrun dies with the
    agent (preflight/base/tether.py), so nothing of a killed run lives on: ranks run in
    sessions of their own, where no group kill reaches them. A plain worker is what the
    agent's trampoline became, and is tied already; a worker run by hand has no launcher."""
    launcher = os.environ.get("PREFLIGHT_LAUNCHER_PID", "")
    if not launcher.isdigit() or int(launcher) == os.getpid():
        return
    # Tied to whoever started this process, which under a --python wrapper that does not
    # exec (a shell script, `conda run`) is torchrun and not the launcher's pid.
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent or parent == 1:
        os._exit(1)  # the parent was gone before the signal was set


def _watch_agent() -> None:
    """And with the agent itself: under a --python wrapper that does not exec, torchrun is the
    wrapper's child and nothing ties it to the agent, so the ranks watch the agent (named with
    its start time in PREFLIGHT_AGENT) from a thread of their own and end the moment it is
    gone; torchrun then ends with its ranks."""
    pid, _, started = os.environ.get("PREFLIGHT_AGENT", "").partition(":")
    if not pid.isdigit() or started in ("", "?"):
        return  # run by hand: no agent to follow
    if _start_time(int(pid)) != started:
        os._exit(1)  # the agent died before this rank started
    try:
        fd = os.pidfd_open(int(pid))  # readable once the process has exited (Linux 5.3)
    except (AttributeError, OSError):
        fd = None

    def watch() -> None:
        import select

        if fd is not None:
            select.select([fd], [], [])
        else:
            while _start_time(int(pid)) == started:
                time.sleep(0.5)
        os._exit(1)

    import threading

    threading.Thread(target=watch, name="preflight-agent-watch", daemon=True).start()


def _start_time(pid: int) -> str | None:
    """/proc/PID/stat's start time, which with the pid names one process (base/tether.py's rule)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().decode(errors="replace").rpartition(")")[2].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 else None
