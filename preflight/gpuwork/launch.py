"""Run a worker script (checks/workers/) in child processes, and never hang on it.

One plain process, or torchrun with N local ranks, under the interpreter the
settings name (``--python``: the training environment's own torch), in a
session of its own, with a deadline. Each rank writes its verdict to
rank{N}.json and its output to rank{N}.log in a private directory; torchrun's
own output goes to a log beside them. Workers may rewrite their JSON as they
go, so after a hang the last thing a rank reported says where it stopped.

On one node, torchrun meets its ranks through its static rendezvous (its
default: a TCPStore on 127.0.0.1, rank assignment in JSON, nothing unpickled)
inside a network namespace of the launch's own (base/tether.py): no other
host and no other process of the node can reach the store or the ranks'
sockets. Across nodes, the static rendezvous too (each node its own
--node-rank), its id passed in the environment (PET_RDZV_ID), never on a
command line every user can read.

Every process started dies with the agent (base/tether.py). Past the deadline
the whole process group gets SIGTERM, then SIGKILL, and so does every process
below it (torchrun starts each rank in a session of its own). Every process
started carries a token in its environment; after any outcome the launcher
looks for that token and reports what it could not kill. A private directory
a killed run left in TMPDIR is removed by the next launch.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from preflight.base import host, tether
from preflight.gpuwork import scratch
from preflight.base.progress import Progress, stage_of

# checks/ installs as preflight.checks; the workers are plain files beside it,
# run by path so an interpreter without preflight installed can run them.
WORKERS_DIR = Path(importlib.util.find_spec("preflight.checks").submodule_search_locations[0]) / "workers"  # type: ignore[union-attr,index]
LOG_TAIL_LINES = 20
TEXT_LIMIT = 4 << 20  # the most read back of any one log a worker leaves (NCCL's INFO logs)
TOKEN_ENV = "PREFLIGHT_LAUNCH_TOKEN"
POLL = 0.05


class LaunchError(Exception):
    """The worker could not be started; ``cause`` and ``remedy`` name the setting."""

    def __init__(self, cause: str, remedy: str):
        super().__init__(cause)
        self.cause, self.remedy = cause, remedy


@dataclass(frozen=True)
class Group:
    """torchrun across nodes: every node's agent meets at node rank 0's store."""

    nnodes: int
    node_rank: int
    endpoint: str  # HOST:PORT, node rank 0's
    rdzv_id: str
    local_addr: str  # this node's address towards the endpoint
    ifname: str | None  # the interface holding it
    join_timeout: float  # how long the agents wait for each other


@dataclass(frozen=True)
class Worker:
    script: str  # file name in checks/workers/, "cuda_init.py"
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the agent's environment
    nproc: int | None = None  # torchrun with this many local ranks; None: one plain process
    rdzv_port: int = 0  # torchrun's rendezvous port on 127.0.0.1; 0: a free one
    group: Group | None = None  # across nodes instead of one node alone


@dataclass(frozen=True)
class Finished:
    returncode: int | None  # None: killed at the deadline or once settled
    timed_out: bool
    seconds: float
    reports: dict[int, Any]  # rank -> what it wrote
    unreadable: dict[int, str]  # rank -> why its file could not be read
    log_tail: list[str]  # the launcher's (torchrun's, or the plain worker's) output
    settled: bool = False  # ended early: the caller saw every rank finished or stuck
    rank_logs: dict[int, list[str]] = field(default_factory=dict)  # rank -> last lines of its output
    rank_exits: dict[int, int] = field(default_factory=dict)  # from torchrun's summary; negative: signal
    root_cause: int | None = None  # the rank torchrun saw fail first
    texts: dict[str, str] = field(default_factory=dict)  # other *.log files the ranks left, by name
    leftover: list[str] = field(default_factory=list)  # processes that outlived the sweep
    endpoint: str | None = None
    world: dict[str, Any] | None = None  # run as a stage of a shared launch: which launch, which stage (gpuwork/world.py)
    isolation: dict[str, Any] | None = None  # where the ranks' sockets lived (tether.isolation)

    @property
    def how_it_ended(self) -> str:
        """"exit 1", "killed by SIGSEGV", "killed at the deadline after 60 s": for causes."""
        if self.timed_out:
            return f"killed at the deadline after {self.seconds:.0f} s"
        if self.settled:
            return f"stopped after {self.seconds:.0f} s, once no rank made progress"
        return exit_words(self.returncode)

    def last_line(self, rank: int) -> str:
        lines = self.rank_logs.get(rank) or []
        return lines[-1] if lines else "none"


class Running:
    """A started worker. ``report()`` peeks at progress; ``wait()`` ends it.
    Given a ``progress`` (the Context's), its stage follows the ranks' reports while the worker runs."""

    def __init__(self, python: str, worker: Worker, timeout: float, progress: Progress | None = None):
        self._nproc = worker.nproc
        self._seen: dict[int, tuple[tuple[int, int, int], Any]] = {}  # rank -> (file identity, report), for stage()
        self._progress = progress
        self._dir, self._owner = scratch.make(LaunchError)
        _live.add(self._dir)
        self.out_dir = self._dir / "out"
        try:
            self.out_dir.mkdir()
        except OSError:
            self._remove()
            raise
        self._log = self._dir / "launcher.log"
        self._isolation = self._dir / "isolation.json"
        self.token = secrets.token_hex(8)
        self.endpoint = None
        env = {
            **os.environ,
            **worker.env,
            TOKEN_ENV: self.token,
            "TMPDIR": str(self._dir),  # torchrun's and torch's own temporary files go with ours
            "PYTHONUNBUFFERED": "1",  # the log's last line must be the last thing said before a hang
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA's device N is nvidia-smi's GPU N
        }
        # Workers run by path and import their sibling _rank.py from the script's folder,
        # which PYTHONSAFEPATH (Python 3.11+, `python -P`) takes off sys.path: every rank
        # would die on import and the check would blame torchrun.
        env.pop("PYTHONSAFEPATH", None)
        argv = [python, str(WORKERS_DIR / worker.script), "--out", str(self.out_dir), *worker.args]
        private_net = False
        if worker.nproc is not None and worker.group is not None:
            g = worker.group
            self.endpoint = g.endpoint
            # torchrun's static rendezvous across nodes too: every node knows its rank, node
            # rank 0 hosts the store, and nothing any peer writes there is unpickled (the c10d
            # rendezvous unpickles its state: whoever reached the port ran code as root on
            # every node). The id, a key prefix, rides in the environment: /proc/PID/cmdline
            # is every user's to read.
            argv[1:1] = [
                "-m", "torch.distributed.run", "--nnodes", str(g.nnodes), "--nproc-per-node", str(worker.nproc),
                "--rdzv-backend", "static", "--rdzv-endpoint", g.endpoint, "--node-rank", str(g.node_rank),
                "--rdzv-conf", f"timeout={int(g.join_timeout)}", "--local-addr", g.local_addr,
                "--max-restarts", "0", "--monitor-interval", "0.1",
            ]  # fmt: skip
            env["PET_RDZV_ID"] = g.rdzv_id
            env["PREFLIGHT_NODE_RANK"] = str(g.node_rank)
            if g.ifname:
                # Without it gloo binds the address the hostname resolves to (often 127.0.1.1)
                # and peers cannot connect; the job's own setting wins.
                for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                    env.setdefault(name, g.ifname)
        elif worker.nproc is not None:
            # The port is taken inside the launch's own network, where nothing else listens: a
            # port a job's torchrun holds on the host is no obstacle (on the host's network, where
            # the kernel refuses a namespace, a taken port is torchrun's own error).
            port = worker.rdzv_port or free_port()
            self.endpoint = f"127.0.0.1:{port}"
            # torchrun's default (static) rendezvous: a store on loopback, ranks assigned in
            # JSON. The c10d one unpickles what its store holds, and any local user could
            # write there. The ranks' sockets stay on loopback too (inside the launch's own
            # network, the only interface there is): a job's interface names are judged by
            # the nccl check before the launch, against the node's interfaces.
            argv[1:1] = [
                "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(worker.nproc),
                "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(port), "--node-rank", "0",
                "--max-restarts", "0", "--monitor-interval", "0.1",
            ]  # fmt: skip
            env.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
            # One node needs no network transport, and the launch's own network has no NIC: an
            # external net plugin (aws-ofi-nccl, GCP's TCPX) or a pinned NCCL_NET would fail NCCL's
            # init there on a node where jobs run fine. The fabric is the multi-node run's to prove.
            env["NCCL_NET_PLUGIN"] = "none"
            env.pop("NCCL_NET", None)
            private_net = True
        self._started = time.monotonic()
        self.deadline = self._started + timeout
        try:
            with open(self._log, "wb") as log:
                self.proc = tether.popen(argv, private_net=private_net, report=str(self._isolation), cwd=self._dir, env=env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError:
            self._remove()
            raise
        if progress is not None:
            progress.follow(self.stage)

    def isolation(self) -> dict | None:
        """Where the launch's sockets live: {"network": "private"}, or "host" and why."""
        return tether.isolation(str(self._isolation))

    def _remove(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
        _live.discard(self._dir)
        os.close(self._owner)

    def report(self, rank: int = 0) -> Any:
        """What the rank has written so far, or None."""
        return read_report(self.out_dir, rank)

    def stage(self) -> str:
        """What the worker is doing now, in a few words (``stage_of``). Called from the
        console's thread a few times a second: a rank's file is parsed again only once
        the rank has rewritten it, so watching costs a stat per rank."""
        reports = []
        for rank in range(self._nproc or 1):
            path = self.out_dir / f"rank{rank}.json"
            try:
                st = path.stat()
                key = (st.st_ino, st.st_mtime_ns, st.st_size)  # each rewrite is a new file (os.replace)
                if self._seen.get(rank, (None,))[0] != key:
                    self._seen[rank] = (key, json.loads(path.read_text()))
            except (OSError, ValueError):
                pass  # not written yet, or the worker is gone: keep what was read last
            reports.append(self._seen.get(rank, (None, None))[1])
        return stage_of(reports, self._nproc)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, settled: Callable[[Running], bool] | None = None) -> Finished:
        """Until the worker exits, the deadline passes, or ``settled(self)`` says
        no rank will make progress (then it is stopped at once, not at the deadline)."""
        try:
            timed_out, early = watch(lambda: self.proc.poll() is None, self.deadline, settled and (lambda: settled(self)))
            leftover = self.end()
            return self._collect(timed_out, early, leftover)
        finally:
            if self._progress is not None:
                self._progress.unfollow(self.stage)
            self.end()
            if self._dir in _live:
                self._remove()

    def end(self, grace: float = 2.0) -> list[str]:
        """Stop the worker and everything it started (SIGTERM, and SIGKILL after
        ``grace`` seconds); name what survived."""
        if self.proc.poll() is None:
            host.stop(self.proc, grace)
        for _ in range(3):
            left = marked(self.token)
            if not left:
                return []
            host.kill_processes(left)
        return [f"pid {p.pid} ({_name(p)})" for p in marked(self.token)]

    def launcher_log(self, n: int = 200) -> list[str]:
        """The last lines torchrun (or the plain worker) printed."""
        return _tail(self._log, n)

    def _collect(self, timed_out: bool, early: bool, leftover: list[str]) -> Finished:
        log_tail = self.launcher_log()
        return Finished(
            returncode=None if timed_out or early else self.proc.returncode,
            timed_out=timed_out,
            seconds=time.monotonic() - self._started,
            log_tail=log_tail[-LOG_TAIL_LINES:],
            settled=early,
            rank_exits=torchrun_exits(log_tail),
            root_cause=torchrun_root_cause(log_tail),
            leftover=leftover,
            endpoint=self.endpoint,
            isolation=self.isolation(),
            **read_out(self.out_dir),
        )


def watch(going: Callable[[], bool], deadline: float, settled: Callable[[], bool] | None = None, poll: float = POLL) -> tuple[bool, bool]:
    """Poll while ``going()``: (timed out, settled early) once the deadline passes or
    ``settled()`` says no rank will progress; (False, False) once it stops going."""
    while going():
        if time.monotonic() >= deadline:
            return True, False
        if settled is not None and settled():
            return False, True
        time.sleep(poll)
    return False, False


def read_report(out_dir: Path, rank: int) -> Any:
    """What ``rank`` has written to ``out_dir`` so far (atomically, so whole or absent), or None."""
    return read_json(out_dir / f"rank{rank}.json")


def read_json(path: Path) -> Any:
    """A file a rank wrote atomically: whole, or None while absent or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_out(out_dir: Path) -> dict[str, dict]:
    """What the ranks left in ``out_dir``: each rank's report (or why it is unreadable),
    the last lines of each rank's log, and any other log by name (NCCL's)."""
    reports, unreadable, rank_logs, texts = {}, {}, {}, {}
    for path in sorted(out_dir.iterdir()):
        rank = path.stem.removeprefix("rank")
        if path.suffix == ".json" and rank.isdigit():
            try:
                reports[int(rank)] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                unreadable[int(rank)] = f"{path.name} is not JSON ({e})"
        elif path.suffix == ".log" and rank.isdigit():
            rank_logs[int(rank)] = _tail(path)
        elif path.suffix == ".log":
            texts[path.name] = _read_tail(path, TEXT_LIMIT)
    return {"reports": reports, "unreadable": unreadable, "rank_logs": rank_logs, "texts": texts}


# Private directories of workers still running: removed at exit, since an
# interrupted run abandons the check's thread before its wait() can clean up.
_live: set[Path] = set()


@atexit.register
def _remove_live() -> None:
    for d in list(_live):
        shutil.rmtree(d, ignore_errors=True)


def start(python: str, worker: Worker, timeout: float, progress: Progress | None = None) -> Running:
    """Raises LaunchError (no usable temporary directory, rendezvous port taken) or OSError (no interpreter).
    ``progress`` (the Context's) takes its stage from the worker's reports until ``wait()`` ends."""
    return Running(python, worker, timeout, progress)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(port: int) -> None:
    # As torchrun's store binds it: every address, SO_REUSEADDR, so a TIME_WAIT
    # left by a killed run is no obstacle but a listener is.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            raise LaunchError(
                f"the rendezvous port 127.0.0.1:{port} is taken{_holder(port)} ({e.strerror or e}): torchrun's store cannot listen there",
                "stop that process, or choose another port (rdzv_port in the config, 0 for a free one)",
            ) from None


def _holder(port: int) -> str:
    try:
        for c in psutil.net_connections("tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                return f" by pid {c.pid} ({_name(psutil.Process(c.pid))})"
    except (psutil.Error, OSError):
        pass
    return ""


# torchrun's failure summary:  "  rank      : 1 (local_rank: 1)" then "  exitcode  : -9 (pid: 8084)"
# Keyed by local rank where torchrun says it: each node reads only its own ranks.
_SUMMARY = re.compile(r"^\s*rank\s*:\s*(\d+)(?:\s*\(local_rank:\s*(\d+)\))?.*?^\s*exitcode\s*:\s*(-?\d+)", re.M | re.S)


def torchrun_exits(lines: list[str]) -> dict[int, int]:
    """rank -> exit code from torchrun's ChildFailedError summary (negative: killed by that signal)."""
    return {int(local or rank): int(code) for rank, local, code in _SUMMARY.findall("\n".join(lines))}


def torchrun_root_cause(lines: list[str]) -> int | None:
    """The rank under torchrun's "Root Cause (first observed failure)"."""
    text = "\n".join(lines)
    at = text.find("Root Cause")
    found = _SUMMARY.search(text, at) if at >= 0 else None
    return int(found.group(2) or found.group(1)) if found else None


def exit_words(code: int | None) -> str:
    """"exit 1", "killed by SIGKILL"."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


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


def _name(p: psutil.Process) -> str:
    """The command line, short and on one line, for a cause."""
    try:
        words = " ".join(" ".join(p.cmdline()[:3]).split())
        return (words[:80] + "...") if len(words) > 80 else words or p.name()
    except psutil.Error:
        return "?"


def _read_tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _tail(log: Path, n: int = LOG_TAIL_LINES) -> list[str]:
    lines = _read_tail(log, 64 * 1024).splitlines()
    return [line for line in lines if line.strip()][-n:]
