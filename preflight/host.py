"""The seams to the machine: a filesystem root, the environment, child processes.

Checks read the machine only through a Host, so tests can point ``root`` at a
recorded sysfs tree and ``environ`` at a chosen environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int | None  # None when killed at the deadline
    stdout: str
    stderr: str
    timed_out: bool


class Host:
    def __init__(self, root: Path | str = "/", environ: Mapping[str, str] | None = None):
        self.root = Path(root)
        self.environ: Mapping[str, str] = os.environ if environ is None else environ

    def path(self, p: str | Path) -> Path:
        """``/dev/shm`` under this host's root."""
        return self.root / str(p).lstrip("/")

    def read_text(self, p: str | Path) -> str:
        return self.path(p).read_text(errors="replace")

    def hostname(self) -> str:
        return socket.gethostname()

    def boot_id(self) -> str | None:
        try:
            return self.read_text("/proc/sys/kernel/random/boot_id").strip()
        except OSError:
            return None

    def run(self, argv: Sequence[str], timeout: float) -> Completed:
        """Run a command in its own session; past the deadline kill its whole group."""
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
            return Completed(tuple(argv), proc.returncode, out, err, False)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            out, err = proc.communicate()
            return Completed(tuple(argv), None, out, err, True)


def kill_group(pgid: int, grace: float = 2.0) -> None:
    """SIGTERM a process group, then SIGKILL what is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)


def descendants() -> set[int]:
    """PIDs of every process below this one, whatever session it started."""
    try:
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return set()


def kill_processes(pids: Iterable[int]) -> list[int]:
    """Kill these processes and the groups they lead; return the PIDs killed.

    A check that timed out may have left children in sessions of their own
    (launched workers); killing by group takes their children too.
    """
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    own_group = os.getpgrp()
    for p in procs:
        try:
            pgid = os.getpgid(p.pid)
            if pgid != own_group and pgid == p.pid:
                os.killpg(pgid, signal.SIGKILL)
            else:
                p.kill()
        except (ProcessLookupError, psutil.Error):
            pass
    psutil.wait_procs(procs, timeout=5)
    return [p.pid for p in procs]
