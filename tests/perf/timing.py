"""What the perf scripts share: one timing loop (median, min and max of N runs),
and one way to run a child that leaves nothing behind.

A bench runs as root on a GPU node (tests/gpu/run.sh), and what it launches
may hang: a torchrun whose ranks wait forever in NCCL's init. torchrun starts
each rank in a session of its own, so killing torchrun's process group misses
the ranks, which are re-parented to PID 1 and keep the GPUs, and keep the
pipes the bench reads from open. So a bench calls ``guard()`` first: it takes
back its children's orphans (a child subreaper, as the agent itself does) and
ends everything below it on SIGTERM or SIGINT before it exits; and ``run()``
ends a child past its deadline with every process below it, and stops
reading pipes that something it could not kill still holds.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from preflight.base.host import become_subreaper, descendants, kill_processes, stop

GRACE = 2.0  # SIGTERM to SIGKILL: torchrun passes the SIGTERM on to its ranks
SIGNAL_GRACE = 1.0  # tests/gpu/run.sh's `timeout -k 2` sends its SIGKILL 2 s after the SIGTERM


def timed(label: str, fn: Callable[[], object], n: int, width: int = 52) -> float:
    """Prints median, min and max in ms; returns the median in seconds."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    print(f"{label:<{width}} {statistics.median(times) * 1000:>8.1f}ms {min(times) * 1000:>8.1f}ms {max(times) * 1000:>8.1f}ms", flush=True)
    return statistics.median(times)


@dataclass(frozen=True)
class Ran:
    seconds: float
    done: subprocess.CompletedProcess
    killed: bool  # it ran past its deadline; ``done`` holds what it wrote before


def guard() -> None:
    """Once, first thing in a bench: orphans of its children come back to it,
    and a SIGTERM or SIGINT ends all of them before the bench exits 128 + signal."""
    become_subreaper()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)


def _on_signal(signum: int, _frame: object) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    ended = end_all(SIGNAL_GRACE)
    print(f"{os.path.basename(sys.argv[0])}: {signal.Signals(signum).name}: ended {len(ended)} process(es) it had started", file=sys.stderr, flush=True)
    sys.exit(128 + signum)


def end_all(grace: float) -> list[int]:
    """SIGTERM to every process below this one (to the group of each that leads
    one), up to ``grace`` seconds for them to exit, then SIGKILL to every one
    still there, orphans taken back since included. Returns the PIDs seen."""
    try:
        below = psutil.Process().children(recursive=True)
    except psutil.Error:
        below = []
    for p in below:
        try:
            if os.getpgid(p.pid) == p.pid:
                os.killpg(p.pid, signal.SIGTERM)
            else:
                p.terminate()
        except (ProcessLookupError, psutil.Error):
            pass
    psutil.wait_procs(below, timeout=grace)
    killed = kill_processes({p.pid for p in below} | descendants())
    _reap()
    return killed


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None, grace: float = GRACE) -> Ran:
    """Wall seconds of a child in its own session. Past ``timeout`` it is
    SIGTERMed with its group, and after ``grace`` seconds SIGKILLed with every
    process below it; whatever is still below this process once the child has
    ended (a rank torchrun left behind) is killed too. Any other exit (a
    signal, an error) ends the child the same way before it goes on up."""
    t = time.perf_counter()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    killed = False
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException as e:
        stop(p, grace)
        kill_processes(descendants())  # ranks in sessions of their own, and orphans taken back
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        killed = True
        try:
            out, err = p.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            # Something this process could not kill still holds the pipes: stop reading.
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            out = err = ""
    seconds = time.perf_counter() - t
    # Ranks the child killed as it ended may come back to this subreaper dead but not yet
    # collected (zombies): those are not left behind, only what still runs is.
    _reap()
    left = kill_processes(_running_below())
    if left:
        print(f"{' '.join(argv[:5])}: killed {len(left)} process(es) it left behind: {left}", file=sys.stderr, flush=True)
    _reap()
    return Ran(seconds, subprocess.CompletedProcess(argv, p.returncode, out or "", err or ""), killed)


def _running_below() -> set[int]:
    """Every process below this one that still runs (a zombie has ended)."""
    out = set()
    for pid in descendants():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.Error:
            pass
    return out


def _reap() -> None:
    """Collect the exit of the orphans taken back and killed: as a subreaper
    this process is their parent now, and no Popen waits for them."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for c in children:
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(c.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass
