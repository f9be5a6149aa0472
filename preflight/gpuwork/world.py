"""One launch of the ranks per run, shared by the checks that need ranks.

Starting ranks costs what a job's start costs: a torch import, a CUDA context
and an NCCL init per rank, seconds on an 8-GPU node. So the run starts them
once (checks/workers/world.py under torchrun, through launch.py) and each
check runs its worker there as a stage: cuda_init, then the NCCL smoke test,
the bandwidth probe and the training probe. A stage looks to its check as a
launch of its own did: its own folder of rank reports and logs, its own
deadline, a ``launch_output.Finished`` at the end, and the same judges read it.

NCCL reads its debug settings once per process, so each rank writes one
NCCL log for the whole launch (checks/workers/world.py sets it up before any
stage runs); at each stage's end the agent moves what the log gained since the
last stage into that stage's folder as ``nccl.rank{N}.log``, where its check
reads it: the nccl check the smoke test's connections, bandwidth the large
collectives' (NVLS, rings), each its own.

A stage that does not end cleanly (a rank failed, died or hung, or the
deadline passed) ends the whole launch, with every process in it: the next
check that needs ranks (under --keep-going) gets a fresh one. A launch across
nodes (the group checks of a run with --nnodes) is kept apart from this node's
own (cuda, train), and never runs beside it: both hold CUDA contexts on this
node's GPUs, which a GPU in EXCLUSIVE_PROCESS mode gives one process at a
time, so the idle one is closed before the other starts.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from preflight.base.progress import Progress, stage_of
from preflight.gpuwork import launch, launch_output

CLOSE_GRACE = 5.0  # seconds the ranks get to exit once told to; then they are killed
NCCL_LOG_LIMIT = 64 << 20  # the most of one rank's NCCL log a stage's folder gets (INFO lines: kilobytes a stage)
IDLE_LIMIT = 7 * 86400.0  # a rank waiting for its next stage gives up after this, whatever else happens


@dataclass(frozen=True)
class Key:
    """What makes a launch fit a worker: one the other cannot use needs its own."""

    python: str
    nproc: int
    rdzv_port: int
    across: tuple[int, str] | None  # (nodes, endpoint) of a group; None on this node alone


class World:
    """A launch kept for several stages. ``stage`` runs one; ``close`` ends it."""

    def __init__(self, number: int, key: Key, worker: launch.Worker):
        self.number, self.key = number, key
        self.stages = 0
        self.busy = False
        self.nccl_read: dict[int, int] = {}  # local rank -> bytes of its NCCL log already given to a stage
        self.over = False  # ended: it takes no more stages
        args = ["--agent-pid", str(os.getpid()), "--until", f"{time.time() + IDLE_LIMIT:.0f}"]
        spec = launch.Worker("world.py", args, env=worker.env, nproc=worker.nproc, rdzv_port=worker.rdzv_port, group=worker.group)
        self.running = launch.start(key.python, spec, IDLE_LIMIT)

    def usable(self) -> bool:
        return not self.over and self.running.alive()

    def said_ready(self) -> dict[int, dict] | None:
        """Each rank's ``ready.rank{N}.json`` (its torch import done, which torch), once every
        rank has written one; None while any is still importing."""
        said = {}
        for rank in range(self.key.nproc):
            report = launch_output.read_json(self.running.out_dir / f"ready.rank{rank}.json")
            if not isinstance(report, dict):
                return None
            said[rank] = report
        return said

    def ready(self) -> bool:
        """Whether a stage would start at once: every rank past its import, or the launch over
        (the stage then says why, or starts a new launch)."""
        return not self.usable() or self.said_ready() is not None

    def stage(self, worker: launch.Worker, timeout: float, progress: Progress | None) -> Stage:
        self.stages += 1
        self.busy = True
        return Stage(self, self.stages, worker, timeout, progress)

    def pids(self) -> set[int]:
        """The launch's processes: torchrun and everything below it (the ranks, in sessions of their own, are still its children)."""
        try:
            below = psutil.Process(self.running.proc.pid).children(recursive=True)
        except psutil.Error:
            below = []
        return {self.running.proc.pid, *(p.pid for p in below)}

    def _ranks_running(self) -> bool:
        """Whether any process below torchrun still runs (one that has exited but that torchrun
        has not yet reaped, a zombie, does not)."""
        try:
            below = psutil.Process(self.running.proc.pid).children(recursive=True)
        except psutil.Error:
            return False
        for p in below:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    return True
            except psutil.Error:
                pass
        return False

    def cut_nccl_logs(self, into: Path, ended: bool) -> None:
        """Move what each rank's NCCL log gained since the last stage into ``into``. A line
        still being written stays for the next stage, unless the launch ``ended`` (then all
        of it is this stage's). NCCL writes its file line-buffered (src/debug.cc), so a
        stage's own lines are whole in it once the stage is over; a line a background
        thread of NCCL writes after the stage lands in the next one's."""
        for rank in range(self.key.nproc):
            src = self.running.out_dir / f"nccl.rank{rank}.log"
            start = self.nccl_read.get(rank, 0)
            try:
                fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)  # the ranks' folder: never through a link
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                f.seek(start)
                data = f.read()
            if not ended:
                data = data[: data.rfind(b"\n") + 1]
            self.nccl_read[rank] = start + len(data)
            if data:
                _write_new(into / f"nccl.rank{rank}.log", data[:NCCL_LOG_LIMIT])

    def end(self) -> list[str]:
        """Kill every process of the launch now; what survived, in words."""
        self.over = True
        return self.running.end()

    def close(self) -> None:
        """Tell the ranks to exit, give them CLOSE_GRACE, then kill what is left; remove the folder.
        A launch that never ran a stage (started early for a check the run never reached) is killed at once.
        torchrun is not waited for: once its ranks are gone it only tears down its rendezvous,
        which nothing reads, and that took 0.37-0.62 s of every run on the 2-core CI VM."""
        if self.stages == 0:
            self.end()
        if not self.over and self.running.alive():
            _write_json(self.running.out_dir / f"stage{self.stages + 1}.json", {"close": True})
            launch.watch(lambda: self.running.alive() and self._ranks_running(), time.monotonic() + CLOSE_GRACE, poll=0.01)
        self.over = True
        self.running.end(grace=0)
        self.running.wait()


class Stage:
    """One worker run inside a World: what ``launch.Running`` is to a launch of its own
    (``report``, ``stage``, ``wait``), so ``ranks.collect`` and the judges do not tell them apart."""

    def __init__(self, world: World, k: int, worker: launch.Worker, timeout: float, progress: Progress | None):
        self.world, self.k = world, k
        self._nproc = worker.nproc or 1
        self.out_dir = world.running.out_dir / f"stage{k}"
        self.out_dir.mkdir()
        self._progress = progress
        self._started = time.monotonic()
        self.deadline = self._started + timeout
        script = str(launch.WORKERS_DIR / worker.script)
        _write_json(world.running.out_dir / f"stage{k}.json", {"script": script, "args": ["--out", str(self.out_dir), *worker.args], "env": dict(worker.env)})
        if progress is not None:
            progress.follow(self.stage)

    def report(self, rank: int = 0) -> Any:
        return launch_output.read_report(self.out_dir, rank)

    def stage(self) -> str:
        return stage_of([self.report(r) for r in range(self._nproc)], self._nproc)

    def alive(self) -> bool:
        return self.world.running.alive() and self._codes() is None

    def _codes(self) -> dict[int, int] | None:
        """Every rank's exit code for this stage, once all have one."""
        codes = {}
        for r in range(self._nproc):
            try:
                codes[r] = int((self.world.running.out_dir / f"stage{self.k}.rank{r}.rc").read_text())
            except (OSError, ValueError):
                return None
        return codes

    def wait(self, settled: Callable[[Stage], bool] | None = None) -> launch_output.Finished:
        """Until every rank has ended the stage, the launch dies, the deadline passes, or
        ``settled(self)`` says no rank will progress; in all but a clean end the launch is ended."""
        try:
            going = lambda: self._codes() is None and self.world.running.alive()  # noqa: E731
            timed_out, early = launch.watch(going, self.deadline, settled and (lambda: settled(self)))
            codes = None if timed_out or early else self._codes()
        finally:
            if self._progress is not None:
                self._progress.unfollow(self.stage)
        clean = codes is not None and not any(codes.values())
        leftover = [] if clean else self.world.end()
        self.world.cut_nccl_logs(self.out_dir, ended=not clean)
        self.world.busy = False
        log_tail = self.world.running.launcher_log()
        if codes is not None:
            returncode: int | None = max(codes.values(), key=abs)
        elif timed_out or early:
            returncode = None
        else:
            returncode = self.world.running.proc.poll()
        return launch_output.Finished(
            returncode=returncode,
            timed_out=timed_out,
            seconds=time.monotonic() - self._started,
            log_tail=log_tail[-launch_output.LOG_TAIL_LINES:],
            settled=early,
            rank_exits=launch_output.torchrun_exits(log_tail) if codes is None else {},
            root_cause=launch_output.torchrun_root_cause(log_tail) if codes is None else None,
            leftover=leftover,
            endpoint=self.world.running.endpoint,  # read at the end: _torchrun.py says its port once it has bound it
            world={"launch": self.world.number, "stage": self.k, "ended_it": not clean},
            isolation=self.world.running.isolation(),
            **launch_output.read_out(self.out_dir),
        )


class Worlds:
    """The run's launches: one at a time, on this node alone or across the group, each
    started by the first stage that needs it. ``after_check`` names the processes of the
    idle ones, which the runner must not sweep away between checks; ``close`` ends them all."""

    def __init__(self) -> None:
        self._by_place: dict[bool, World] = {}
        self.launches = 0

    def stage(self, python: str, worker: launch.Worker, timeout: float, progress: Progress | None = None) -> Stage:
        """Run ``worker`` as a stage of the launch that fits it, started now if there is none.
        Raises what ``launch.start`` raises when a launch cannot start."""
        group = worker.group
        key = Key(python, worker.nproc or 1, worker.rdzv_port, (group.nnodes, group.endpoint) if group else None)
        place = group is not None
        world = self._by_place.get(place)
        if world is None or world.key != key or not world.usable() or world.busy:
            # Every launch runs on the same GPUs, this node's, and each of its ranks keeps the
            # CUDA context it made: on a GPU in EXCLUSIVE_PROCESS mode a second launch's ranks
            # cannot make theirs ("all CUDA-capable devices are busy or unavailable") while the
            # first one lives, idle or not. So every other launch ends before a new one starts.
            self._close_all()
            world = World(self.launches + 1, key, worker)  # raises as launch.start does: nothing is counted then
            self.launches += 1
            self._by_place[place] = world
        return world.stage(worker, timeout, progress)

    def prestart(self, python: str, nproc: int, rdzv_port: int) -> None:
        """Start this node's launch now, before the check that needs it: the torch imports
        then overlap the checks that come first. One already started for the same interpreter,
        ranks and port (the run's head start, pipeline/head_start.py) is kept; any other ends
        first. A launch that cannot start says why at that check's stage, where ``stage`` tries again."""
        key = Key(python, nproc, rdzv_port, None)
        have = self._by_place.get(False)
        if have is not None and have.key == key and have.stages == 0 and have.usable():
            return
        self._close_all()
        worker = launch.Worker("world.py", nproc=nproc, rdzv_port=rdzv_port)
        try:
            self._by_place[False] = World(self.launches + 1, key, worker)
        except (launch.LaunchError, OSError):
            return
        self.launches += 1

    def starting(self) -> World | None:
        """This node's launch while its ranks still import torch (one ``prestart`` began):
        the checks that need no ranks run meanwhile."""
        world = self._by_place.get(False)
        return world if world is not None and world.stages == 0 and not world.ready() else None

    def torch_said(self, python: str, deadline: float) -> dict[int, dict] | None:
        """What this node's launch of ``python`` said of its torch, rank by rank, once every
        rank has imported it (waited for until ``deadline``, a time.monotonic()); None where
        no such launch is up, or it ended or the deadline passed before every rank said."""
        world = self._by_place.get(False)
        if world is None or world.key.python != python:
            return None
        launch.watch(lambda: world.usable() and world.said_ready() is None, deadline, poll=0.02)
        return world.said_ready() if not world.over else None

    def after_check(self) -> set[int]:
        """Once a check is over: a launch still busy in its stage (the check was stopped
        mid-stage) is ended with it; the processes of the idle ones, to be spared."""
        pids: set[int] = set()
        for world in self._by_place.values():
            if world.busy:
                world.end()
                world.busy = False
            elif world.usable():
                pids |= world.pids()
        return pids

    def close(self) -> None:
        self._close_all()

    def _close_all(self) -> None:
        for world in self._by_place.values():
            world.close()
        self._by_place.clear()


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _write_new(path: Path, data: bytes) -> None:
    """Write ``data`` as a new file at ``path`` in a folder the ranks write too: whatever a
    rank left there under that name (a link, say) is removed, never followed or written through."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError:
        return  # put back in the meantime: this stage goes without its NCCL lines
    with os.fdopen(fd, "wb") as f:
        f.write(data)
