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

What the ranks and torchrun leave behind is read by gpuwork/launch_output.py;
the processes a launch started are found by gpuwork/processes.py.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preflight.base import host, tether
from preflight.gpuwork import scratch
from preflight.gpuwork.launch_output import LOG_TAIL_LINES, Finished, read_out, read_report, tail_lines, torchrun_exits, torchrun_root_cause
from preflight.gpuwork.processes import TOKEN_ENV, marked, port_holder, process_name
from preflight.base.progress import Progress, stage_of

# checks/ installs as preflight.checks; the workers are plain files beside it,
# run by path so an interpreter without preflight installed can run them.
WORKERS_DIR = Path(importlib.util.find_spec("preflight.checks").submodule_search_locations[0]) / "workers"  # type: ignore[union-attr,index]
POLL = 0.05
ENDPOINT_ENV = "PREFLIGHT_ENDPOINT_FILE"  # where _torchrun.py writes the port it bound (checks/workers/_torchrun.py)


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
        self._endpoint: str | None = None
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
            self._endpoint = g.endpoint
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
            # port a job's torchrun holds on the host is no obstacle. Port 0: _torchrun.py binds a
            # free one itself and says which (endpoint), so none lies free between a choosing and
            # a binding, where on the host's network (no namespace) another user could take it.
            self._endpoint = f"127.0.0.1:{worker.rdzv_port}"
            env[ENDPOINT_ENV] = str(self._dir / "endpoint")
            # torchrun's static rendezvous, ranks assigned in JSON (the c10d one unpickles what
            # its store holds, and any local user could write there), through _torchrun.py: its
            # store listens on 127.0.0.1 alone, where torchrun's own would listen on every
            # interface, reachable from other hosts wherever the launch gets no network of its
            # own. The ranks' sockets stay on loopback too (inside the launch's own network,
            # the only interface there is): a job's interface names are judged by the nccl
            # check before the launch, against the node's interfaces.
            argv[1:1] = [
                str(WORKERS_DIR / "_torchrun.py"), "--nnodes", "1", "--nproc-per-node", str(worker.nproc),
                "--rdzv-backend", "preflight-loopback", "--rdzv-endpoint", self._endpoint,
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

    @property
    def endpoint(self) -> str | None:
        """Where torchrun's store listens (HOST:PORT); on one node with no port set, the one
        _torchrun.py bound, once it has (until then "127.0.0.1:0")."""
        if self._endpoint is not None and self._endpoint.endswith(":0"):
            try:
                self._endpoint = f"127.0.0.1:{int((self._dir / 'endpoint').read_text())}"  # kept: the directory goes with the launch
            except (OSError, ValueError):
                pass
        return self._endpoint

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
        return [f"pid {p.pid} ({process_name(p)})" for p in marked(self.token)]

    def launcher_log(self, n: int = 200) -> list[str]:
        """The last lines torchrun (or the plain worker) printed."""
        return tail_lines(self._log, n)

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
                f"the rendezvous port 127.0.0.1:{port} is taken{port_holder(port)} ({e.strerror or e}): torchrun's store cannot listen there",
                "stop that process, or choose another port (rdzv_port in the config, 0 for a free one)",
            ) from None
