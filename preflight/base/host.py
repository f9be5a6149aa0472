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

from preflight.base import tether, tooltext
from preflight.base.units import parse_cpulist


def read_stripped(path: str | Path) -> str | None:
    """A small text file (sysfs, /proc) without its surrounding whitespace; None where it
    cannot be read. Bytes that are not UTF-8 become U+FFFD rather than an exception."""
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return None


# Kept before a check's deadline when a tool starts, for what follows it: a tool that ignores
# SIGTERM at its deadline is given stop()'s 2 s grace before SIGKILL, then the check needs its
# fallback source (sysfs, NVML already read) and its judges, well under a second.
RESERVE_SECONDS = 3.0
LEAST_SECONDS = 0.5  # a tool given less is not started: nvidia-smi alone loads NVML for longer


def tool_time(deadline: float, cap: float, reserve: float = RESERVE_SECONDS) -> float | None:
    """The seconds a tool starting now may take: ``cap``, or what is left before ``deadline``
    (time.monotonic()) less ``reserve`` where that is sooner; None where too little is left
    to start it (the caller says it unread, and its fallback answers)."""
    left = min(cap, deadline - time.monotonic() - reserve)
    return left if left >= LEAST_SECONDS else None


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

    def cgroup_levels(self, controller: str) -> list[tuple[bool, list[Path]]]:
        """For each hierarchy that holds ``controller``: whether it is v2 (the
        unified one; else v1's own mount), and this process's cgroup directory
        with every ancestor up to the mount, leaf first, since a parent's
        limit binds the child too."""
        try:
            lines = self.read_text("/proc/self/cgroup").splitlines()
        except OSError:
            return []
        found = []
        for line in lines:
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            _, controllers, rel = parts
            if controllers == "":
                mount = self.path("/sys/fs/cgroup")
            elif controller in controllers.split(","):
                mount = self.path(f"/sys/fs/cgroup/{controllers}")
                if not mount.is_dir():
                    mount = self.path(f"/sys/fs/cgroup/{controller}")
            else:
                continue
            leaf = mount / rel.strip().lstrip("/")
            if not leaf.is_dir():
                leaf = mount  # a cgroup namespace shows our own cgroup as the mount's root
            levels = [leaf]
            while levels[-1] != mount and levels[-1].parent != levels[-1]:
                levels.append(levels[-1].parent)
            found.append((controllers == "", levels))
        return found

    def allowed_cpus(self) -> set[int]:
        """The CPUs this process may run on (its cpuset: in a container, maybe
        far fewer than the machine has). Under a recorded root, what that
        process's /proc/self/status said."""
        if self.root == Path("/"):
            return set(os.sched_getaffinity(0))
        for line in self.read_text("/proc/self/status").splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return set(parse_cpulist(line.split(":", 1)[1]))
        raise OSError(f"no Cpus_allowed_list in {self.path('/proc/self/status')}")

    def run(self, argv: Sequence[str], timeout: float, cwd: str | None = None) -> Completed:
        """Run a command in its own session; past the deadline kill its whole group.

        Every tool preflight runs goes through here (or ``start``): in the C locale with no
        terminal (tooltext.environment), its output decoded as UTF-8 (a bad byte becomes U+FFFD)
        and cleaned of terminal control sequences (tooltext.clean) before a reader sees it."""
        return self.start(argv, cwd).finish(timeout)

    def start(self, argv: Sequence[str], cwd: str | None = None) -> Started:
        """``run`` in two halves: the command starts now, and ``finish`` waits for it under its
        deadline, so other work goes on meanwhile. Whoever starts one must finish or stop it.
        Every command is tethered: it dies with this process too (base/tether.py), since a
        SIGKILLed agent runs no deadline, and a tool hung on a wedged driver would stay."""
        proc = tether.popen_tool(
            list(argv),
            cwd=cwd,
            env=tooltext.environment(os.environ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        return Started(tuple(argv), proc)


class Started:
    """A command ``Host.start`` began: ``finish`` reads its answer, ``stop`` ends it unread."""

    def __init__(self, argv: tuple[str, ...], proc: subprocess.Popen):
        self.argv, self.proc = argv, proc

    def finish(self, timeout: float) -> Completed:
        """Its answer, waited for up to ``timeout`` seconds from now; past that its whole group is killed."""
        proc = self.proc
        try:
            out, err = proc.communicate(timeout=timeout)
            return Completed(self.argv, proc.returncode, _text(out), _text(err), False)
        except BaseException as e:
            stop(proc)  # the deadline, or a signal or error in this process: the child goes too
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            try:
                out, err = proc.communicate(timeout=1)
            except subprocess.TimeoutExpired:
                # Something we could not kill still holds the pipes: stop reading.
                for stream in (proc.stdout, proc.stderr):
                    if stream:
                        stream.close()
                out = err = b""
            return Completed(self.argv, None, _text(out), _text(err), True)

    def stop(self) -> None:
        """End it, and everything below it, without reading its answer."""
        if self.proc.poll() is None:
            stop(self.proc, grace=0.5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
        try:
            self.proc.wait(timeout=2)  # reaped: no zombie left behind
        except subprocess.TimeoutExpired:
            pass


def _text(data: bytes | None) -> str:
    return tooltext.clean((data or b"").decode("utf-8", errors="replace"))


def stop(proc: subprocess.Popen, grace: float = 2.0) -> None:
    """End a child that leads its own session, and everything below it.

    SIGTERM to the group, up to ``grace`` seconds for the leader to exit, then
    SIGKILL to the group and to every descendant seen before, including any
    that moved to a session of their own (setsid) and so left the group.
    """
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        below = []
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.poll()
    kill_processes(below)


def become_subreaper() -> None:
    """Orphans of our children are re-parented to us instead of to init, so a
    grandchild that daemonised (setsid + fork) is still found by descendants()
    and killed with the check that started it. Linux only; a no-op elsewhere."""
    try:
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def descendants() -> set[int]:
    """PIDs of every process below this one, whatever session it started."""
    return {p.pid for p in descendant_processes()}


def descendant_processes() -> set[psutil.Process]:
    """Every process below this one, as psutil knows it (pid and start time: two sets taken apart
    in time differ by a pid reused between them), whatever session it started."""
    try:
        return set(psutil.Process().children(recursive=True))
    except psutil.Error:
        return set()


def kill_processes(pids: Iterable[int | psutil.Process]) -> list[int]:
    """Kill these processes and the groups they lead; return the PIDs killed.

    A check that timed out may have left children in sessions of their own
    (launched workers); killing by group takes their children too. Given as
    psutil.Process objects seen earlier, a process is killed only while it is
    the one seen (its start time unchanged): a pid freed and reused since is
    another user's process, never touched.
    """
    procs = []
    for pid in pids:
        try:
            procs.append(pid if isinstance(pid, psutil.Process) else psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    own_group = os.getpgrp()
    killed = []
    for p in procs:
        try:
            if not p.is_running():  # ended, and its pid perhaps another process's now
                continue
            pgid = os.getpgid(p.pid)
            if pgid != own_group and pgid == p.pid:
                os.killpg(pgid, signal.SIGKILL)
            else:
                p.kill()
            killed.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    _wait_dead(killed, timeout=5.0)
    return [p.pid for p in killed]


def _wait_dead(procs: list[psutil.Process], timeout: float) -> None:
    """Until each process is dead or ``timeout`` passes. A zombie is dead: an
    orphan's is reaped by PID 1 when PID 1 gets to it (1.5 s later on some VMs'
    init, never under a container init that does not reap), and waiting for
    that would hold every killed check past its deadline for nothing."""
    deadline = time.monotonic() + timeout
    alive = procs
    while alive:
        _, alive = psutil.wait_procs(alive, timeout=0.02)
        alive = [p for p in alive if not _zombie(p)]
        if time.monotonic() >= deadline:
            return


def _zombie(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
