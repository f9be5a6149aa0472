"""The record of a run that started: what tells a run under way from one that died.

`preflight run --report PATH` writes PATH.started under the lock before its
first check (outputs/gate.py) and removes it once its report is written. A
report says nothing of a run that began after it: when that run dies (the
agent SIGKILLed by the OOM killer or systemd, a bug), the last verdict would
go on vouching for a node whose check was cut off mid-way. So the readers'
rule (last_report.standing) asks whether the run a record names still lives:
its pid, with the start time the kernel gave that process (a pid is reused),
in this boot. Under way: the last verdict stands. Gone without a report:
the node is not vouched.

Where the pid cannot be looked at from here (another pid namespace: a pod
reading the host's report; /proc mounted with hidepid), the run's own
deadline, written in the record, decides: under way until then, gone after.

Standard library only, and a few system calls: `status` reads it every time.
"""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

SUFFIX = ".started"
MAX_BYTES = 4096  # a record is about 250 bytes


class Started(NamedTuple):
    """A record, with what its reader found of the run it names."""

    started_at: datetime  # the run's started_at: its report, once written, has the same
    deadline: datetime  # by when the run ends, every check to its deadline
    boot_id: str | None
    alive: bool | None  # the process now: True running, False gone, None cannot tell from here


def path_for(report: Path) -> Path:
    """Beside the report, under the path readers are given (not a symlink's target), so they find it."""
    return report.with_name(report.name + SUFFIX)


def render(started_at: datetime, deadline: datetime, boot_id: str | None) -> str:
    """This process's record: what a reader needs to tell it from a dead run, or from a pid reused."""
    return json.dumps({
        "started_at": started_at.isoformat(),
        "deadline": deadline.isoformat(),
        "pid": os.getpid(),
        "process_start": _start_ticks(os.getpid()),
        "boot_id": boot_id,
        "pid_namespace": _pid_namespace(),
    }) + "\n"


def read(report: Path) -> Started | None:
    """The record beside ``report``, if one is there that the report's owner wrote; None
    otherwise (no run started since the report, or a file no run of ours wrote)."""
    try:
        fd = os.open(path_for(report), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None  # none (the common case), a symlink, unreadable here
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in _writers(report):
            return None  # a record another user planted in a shared directory steers nothing
        data = json.loads(os.read(fd, MAX_BYTES))  # a longer file is cut, and then not JSON: not ours
        started, deadline = datetime.fromisoformat(data["started_at"]), datetime.fromisoformat(data["deadline"])
        pid, ticks, boot = int(data["pid"]), data["process_start"], data["boot_id"]
        if started.tzinfo is None or deadline.tzinfo is None:
            return None
        return Started(started, deadline, boot if isinstance(boot, str) else None, _alive(pid, ticks, data.get("pid_namespace")))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # not a record this preflight wrote
    finally:
        os.close(fd)


def _writers(report: Path) -> tuple[int, ...]:
    """Whose record counts: the report's owner, or, before any report exists, root's or this user's."""
    try:
        return (os.stat(report).st_uid,)
    except (OSError, ValueError):
        return (0, os.geteuid())


def _alive(pid: int, ticks: object, namespace: object) -> bool | None:
    if pid <= 0 or namespace != _pid_namespace() or not isinstance(ticks, int):
        return None  # its pid means another process here, or nothing: the deadline decides
    try:
        state, now_ticks = _stat(pid)
    except FileNotFoundError:
        try:
            os.kill(pid, 0)  # hidepid hides another user's /proc entry, not whether the pid exists
        except ProcessLookupError:
            return False
        except OSError:
            return None
        return None
    except (OSError, ValueError, IndexError):
        return None
    return state not in ("Z", "X", "x") and now_ticks == ticks  # a zombie has ended; other ticks: the pid was reused


def _stat(pid: int) -> tuple[str, int]:
    """(state, start time in clock ticks since boot) from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()  # after the command name, which may hold spaces and ")"
    return fields[0].decode(), int(fields[19])


def _start_ticks(pid: int) -> int | None:
    try:
        return _stat(pid)[1]
    except (OSError, ValueError, IndexError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
