"""Run a worker script (checks/workers/) in a child process, and never hang on it.

The worker runs under the interpreter the settings name (``--python``: the
training environment's own torch), in a session of its own, with a deadline;
its output goes to a log file and its verdict to one JSON file per rank,
written atomically into a private directory. Workers may rewrite that file
as they go, so after a hang the last thing a rank reported says where it
stopped. Past the deadline the whole process group gets SIGTERM, then
SIGKILL; after any outcome nothing of the worker may be left running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from preflight import host

# checks/ installs as preflight.checks; the workers are plain files beside it,
# run by path so an interpreter without preflight installed can run them.
WORKERS_DIR = Path(importlib.util.find_spec("preflight.checks").submodule_search_locations[0]) / "workers"  # type: ignore[union-attr,index]
LOG_TAIL_LINES = 20


@dataclass(frozen=True)
class Worker:
    script: str  # file name in checks/workers/, "cuda_init.py"
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the agent's environment


@dataclass(frozen=True)
class Finished:
    returncode: int | None  # None: killed at the deadline
    timed_out: bool
    seconds: float
    reports: dict[int, Any]  # rank -> what it wrote
    unreadable: dict[int, str]  # rank -> why its file could not be read
    log_tail: list[str]

    @property
    def how_it_ended(self) -> str:
        """"exit 1", "killed by SIGSEGV", "killed at the 60 s deadline": for causes."""
        if self.timed_out:
            return f"killed at the deadline after {self.seconds:.0f} s"
        if self.returncode is not None and self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit {self.returncode}"


class Running:
    """A started worker. ``report()`` peeks at progress; ``wait()`` ends it."""

    def __init__(self, python: str, worker: Worker, timeout: float):
        self._dir = Path(tempfile.mkdtemp(prefix="preflight-worker-"))
        self.out_dir = self._dir / "out"
        self.out_dir.mkdir()
        self._log = self._dir / "worker.log"
        self._started = time.monotonic()
        self.deadline = self._started + timeout
        env = {
            **os.environ,
            **worker.env,
            "PYTHONUNBUFFERED": "1",  # the log's last line must be the last thing said before a hang
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA's device N is nvidia-smi's GPU N
        }
        argv = [python, str(WORKERS_DIR / worker.script), "--out", str(self.out_dir), *worker.args]
        with open(self._log, "wb") as log:
            try:
                self.proc = subprocess.Popen(
                    argv,
                    cwd=self._dir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError:
                shutil.rmtree(self._dir, ignore_errors=True)
                raise

    def report(self, rank: int = 0) -> Any:
        """What the rank has written so far, or None."""
        try:
            return json.loads((self.out_dir / f"rank{rank}.json").read_text())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self) -> Finished:
        try:
            try:
                self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            self._end()
            return self._collect(timed_out)
        finally:
            self._end()
            shutil.rmtree(self._dir, ignore_errors=True)

    def _end(self) -> None:
        """Stop the worker if it still runs, then sweep its group: a rank the
        leader left behind must not outlive the check."""
        if self.proc.poll() is None:
            host.stop(self.proc)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _wait_group_gone(self.proc.pid)

    def _collect(self, timed_out: bool) -> Finished:
        reports, unreadable = {}, {}
        for path in sorted(self.out_dir.glob("rank*.json")):
            rank = path.stem.removeprefix("rank")
            if not rank.isdigit():
                continue
            try:
                reports[int(rank)] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                unreadable[int(rank)] = f"{path.name} is not JSON ({e})"
        return Finished(
            returncode=None if timed_out else self.proc.returncode,
            timed_out=timed_out,
            seconds=time.monotonic() - self._started,
            reports=reports,
            unreadable=unreadable,
            log_tail=_tail(self._log),
        )


def start(python: str, worker: Worker, timeout: float) -> Running:
    return Running(python, worker, timeout)


def _tail(log: Path) -> list[str]:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if line.strip()][-LOG_TAIL_LINES:]


def _wait_group_gone(pgid: int, timeout: float = 5.0) -> None:
    """Up to ``timeout`` s for every member of the group to be gone (a zombie
    counts as gone: it runs nothing and its parent reaps it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        if not alive:
            return
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        time.sleep(0.05)
