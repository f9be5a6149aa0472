"""What every torchrun worker shares: who this rank is, where its output goes,
how it reports, and the test-only fault knob.

Standard library only. Workers run by path, so this file beside them is
importable as ``_rank`` under any interpreter, with or without preflight.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import _tether

# Test-only fault injection, inert unless set: "RANK:KIND[@OP]" (RANK * for all), for example
# "1:kill@all_reduce_fp32_large"; several, comma-separated ("1:slow@memcpy,0:kill@latency"),
# so a test can pair a slow figure with a hard fault. KIND is kill (SIGKILL itself), stop (SIGSTOP
# itself: a hang), raise (an exception), wrong (a corrupted contribution,
# so the result is wrong everywhere) or slow (each timed repeat sleeps three
# times its own length, at least 0.1 s, inside the timed region: a slow GPU or core).
# slow-once is slow on the first reading only: a check that sees a figure beyond its
# floor launches the worker again with --reading 2 to confirm it (preflight/checkkit/confirm.py),
# and in that launch slow-once does nothing, as a passing load or clock change would.
# A kind may carry a number, KIND=VALUE (Fault.value): slow=2 stretches each timed repeat to
# twice its length (a rank 2x slower that still clears an absolute floor: the node-median
# outlier test; slow_seconds); what the number means is the worker's to say where it reads it.
# A number in seconds, slow=0.5s (Fault.pauses), makes each timed repeat sleep that long
# instead: a fault fixed in time, which no load on the machine can shrink or stretch the way
# it does a multiple of the repeat's own (noisy) length.
# OP names the step it fires at ("start": before the rank has written anything);
# without it, the worker's first step. The tests prove each fault ends in a
# FAIL naming the rank (slow-once: a WARN "transient"); nothing else reads it.
FAULT_ENV = "PREFLIGHT_WORKER_FAULT"


_tether.tie()  # first of all: nothing of a killed run may live on


# Set by world.py when this rank runs workers one after another in one launch (a
# stage each): torch was imported once, and the process group outlives each worker.
WORLD: dict = {"active": False, "import_seconds": None, "stage": 0}


@dataclass(frozen=True)
class Rank:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int


def whoami() -> Rank:
    """From torchrun's environment; a plain `python worker.py` is rank 0 of 1."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    return Rank(int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0")), world, int(env.get("LOCAL_WORLD_SIZE", str(world))))


# Files are named by LOCAL rank: each node's agent reads its own ranks' files, and
# on one node the local rank is the rank. The global rank is inside the report.


def redirect_output(out: str | None, rank: int) -> None:
    """Send this rank's stdout and stderr (Python's and the C libraries') to
    rank{N}.log in ``out``: the agent reads its last line when the rank
    dies, and the ranks' lines do not interleave."""
    if out is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(os.path.join(out, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def exit_now(code: int | None) -> None:
    """End the worker with ``code`` once its output is out, without the interpreter's teardown:
    there torch's C++ threads (gloo's, the store's) can meet a destructor and abort the process
    ("terminate called without an active exception", SIGABRT: one run in six on a loaded 2-core
    machine), which would read as a rank that failed after it had said it was done."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code if isinstance(code, int) else 0)


def write_report(out: str | None, rank: int, report: dict) -> None:
    """Atomic, so the agent may read rank{N}.json at any moment, even after a kill."""
    if out is None:
        return
    tmp = os.path.join(out, f".rank{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, os.path.join(out, f"rank{rank}.json"))


def base_report(r: Rank) -> dict:
    return {
        "rank": r.rank,
        "local_rank": r.local_rank,
        "world_size": r.world_size,
        "host": socket.gethostname(),
        "node_rank": int(os.environ.get("PREFLIGHT_NODE_RANK", "0")),  # preflight's node rank, not torchrun's GROUP_RANK
        "pid": os.getpid(),
        "python": sys.executable,
        "stage": "import",
        "error": None,
        "started": time.time(),
    }


def begin(out: str | None, first_op: str, reading: int | None = None, **fields) -> tuple[Rank, dict, Callable[[], None], Fault]:
    """What every worker does first: learn its rank, send its output to its log, and
    write its first report (base_report and ``fields``; ``reading`` too where the worker
    measures again to confirm) once the "start" fault has had its chance (a rank that
    never reports at all). Returns the rank, the report, the ``save`` that rewrites it,
    and the fault knob."""
    me = whoami()
    redirect_output(out, me.local_rank)
    report = base_report(me)
    report.update(fields if reading is None else {**fields, "reading": reading})

    def save() -> None:
        write_report(out, me.local_rank, report)

    fault = Fault(me.rank, first_op=first_op, reading=reading or 1)
    fault.at("start")
    save()
    return me, report, save, fault


class Fault:
    """The knob, parsed once. ``at(op)`` fires when this rank reaches ``op``.
    ``reading``: which launch of the worker this is (1, or 2 when a check measures again)."""

    def __init__(self, rank: int, first_op: str, reading: int = 1):
        self.kinds: dict[str, str] = {}  # op -> kind, for this rank
        self.values: dict[str, float] = {}  # op -> the number a kind carries ("slow=2": 2)
        self.pauses: dict[str, float] = {}  # op -> the seconds a kind carries ("slow=0.5s": 0.5)
        self.reading = reading
        for spec in os.environ.get(FAULT_ENV, "").split(","):
            who, _, what = spec.partition(":")
            if spec.strip() and who.strip() in (str(rank), "*"):  # "*": every rank
                kind, _, op = what.partition("@")
                kind, _, value = kind.partition("=")
                op = op.strip() or first_op
                self.kinds[op] = kind.strip()
                value = value.strip()
                if value.endswith("s"):
                    self.pauses[op] = float(value[:-1])
                elif value:
                    self.values[op] = float(value)

    def value(self, op: str, default: float) -> float:
        """The number the fault at ``op`` carries (slow=F: the factor), else ``default``."""
        return self.values.get(op, default)

    def at(self, op: str) -> str | None:
        """Act out kill/stop/raise here; return "wrong" or "slow" for the caller to act out."""
        kind = self.kinds.get(op)
        if kind == "slow-once":
            kind = "slow" if self.reading == 1 else None
        if kind is None:
            return None
        print(f"{FAULT_ENV}: injecting {kind} at {op}" + (f" (reading {self.reading})" if self.reading != 1 else ""), flush=True)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if kind == "raise":
            raise RuntimeError(f"{FAULT_ENV} asked rank to raise at {op}")
        return kind


def slow_seconds(elapsed: float, factor: float | None, times: float, least: float, pause: float | None = None) -> float:
    """What the slow fault sleeps after a timed repeat that took ``elapsed``, inside the
    timed region: slow=Ns (``pause``) sleeps N seconds whatever the repeat took; slow=F
    (``factor``) stretches the repeat to F times its length, with no floor, so the figure
    reads 1/F of the rank's own; plain slow sleeps ``times`` its length, at least ``least``
    seconds (a figure far under any floor)."""
    if pause is not None:
        return pause
    if factor is not None:
        return max(0.0, (factor - 1) * elapsed)
    return max(least, times * elapsed)


def guarded(body, report: dict, save) -> int:
    """Run the worker's body; any failure, even a KeyboardInterrupt, goes into the
    report with its traceback, and the rank exits without a clean shutdown: with a
    peer gone, NCCL's and gloo's teardown can block."""
    try:
        return body()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the report
        import traceback

        report.update(error=f"{type(e).__name__}: {e}".strip(), error_time=time.time(), traceback=traceback.format_exc(limit=6).splitlines()[-12:])
        save()
        print(traceback.format_exc(), flush=True)
        os._exit(1)


# A process group's timeout exceeds the worker's own deadline (--timeout) by this
# much on NCCL, where every wait spins itself (spin below): the rank then gives up first and
# reports where it stopped, before NCCL's watchdog tears the process down (SIGABRT, no report).
GRACE = 10.0


def spin(done, seconds: float, what: str) -> None:
    """Wait until ``done()`` is true, spinning: a sleep would add its own length
    to any figure timed around the wait (torch's blocking wait sleeps 1-10 ms
    between polls). Past ``seconds``, raise, so the rank reports where it
    stopped instead of hanging on a peer that did."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not done after {seconds:g} s: a peer stopped, or this GPU hangs")


def wait_for_gpu(torch, seconds: float, what: str, event=None) -> None:
    """Until the GPU has done what is queued on the current stream (or ``event``), by spin."""
    if event is None:
        event = torch.cuda.Event()
        event.record()
    spin(event.query, seconds, what)


def finish(torch, work, seconds: float, what: str, cuda: bool) -> None:
    """Wait for a collective started with async_op=True, within ``seconds``. On the GPU
    Work.wait() without blocking wait only makes the current stream wait for NCCL's,
    so the host then spins on the stream with the deadline; gloo's wait raises at the
    group's own timeout, which is the worker's (init_group)."""
    work.wait()
    if cuda:
        wait_for_gpu(torch, seconds, what)


def group_env() -> None:
    """What ProcessGroupNCCL reads once, in its constructor, for every stage that will use
    the group: no blocking wait (it polls with a sleep that lands in timed figures; every wait
    here spins with its own deadline instead). Set before the group is made, by whichever
    stage makes it: a later stage's setting would be read by nothing."""
    os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "0"


NCCL_SUBSYS = "INIT,ENV,NET,P2P,SHM"  # version, env, network, and every channel's transport


def nccl_debug(path: str) -> None:
    """NCCL's INFO lines to ``path``. NCCL reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and
    NCCL_DEBUG_FILE once per process, at its first call (src/debug.cc, ncclDebugInit),
    and writes the file line-buffered: set before that call, and never again."""
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS=NCCL_SUBSYS, NCCL_DEBUG_FILE=path)


def init_group(dist, backend: str, device, seconds: float) -> None:
    """init_process_group, eager where torch allows, for a worker whose every wait has
    ``seconds`` as its deadline (spin, finish). The group's own timeout is that on gloo
    (its waits raise then), and GRACE more on NCCL: its watchdog, which kills the process
    without a word, is only the backstop behind the rank's own deadline. A group an earlier
    stage made is kept, with this worker's timeout (where torch can change it)."""
    import datetime
    import inspect

    timeout = datetime.timedelta(seconds=seconds + (GRACE if backend == "nccl" else 0))
    if WORLD["active"] and dist.is_initialized():
        # An NCCL init costs seconds on 8 GPUs: keep the group.
        if hasattr(dist.distributed_c10d, "_set_pg_timeout"):
            dist.distributed_c10d._set_pg_timeout(timeout)
        return
    if backend == "nccl":
        group_env()
        if "device_id" in inspect.signature(dist.init_process_group).parameters:  # torch >= 2.2
            dist.init_process_group("nccl", timeout=timeout, device_id=device)  # eager init, so init time is init time
        else:
            dist.init_process_group("nccl", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)


def end_group(dist) -> None:
    """The worker's clean end. In a launch shared by several stages the group stays for the next."""
    if not WORLD["active"]:
        dist.destroy_process_group()


def pci_bus_id(props) -> str | None:
    """The PCI address torch's device properties give, as NVML writes it."""
    if not hasattr(props, "pci_bus_id"):  # older torch does not say
        return None
    return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


def start_torch(want: str, local_rank: int, report: dict, save):
    """Import torch and take this rank's device (cuda:LOCAL_RANK, or the CPU), saying
    in the report what stops the rank: (torch, torch.distributed, device), or None."""
    t0 = time.perf_counter()
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # ImportError, or CUDA libraries that fail to load (OSError)
        report.update(stage="import", error=f"{type(e).__name__}: {e}", error_kind="no_torch")
        save()
        return None
    # In a shared launch the first stage pays the import (world.py timed it); the next pay nothing,
    # and say so rather than time a lookup in sys.modules (a loaded machine can preempt even that).
    if WORLD["active"]:
        seconds = WORLD["import_seconds"] if WORLD["stage"] == 1 else 0.0
    else:
        seconds = round(time.perf_counter() - t0, 4)
    report.update(torch_version=torch.__version__, import_seconds=seconds, stage="init")
    device = torch.device("cpu")
    if want == "cuda":
        if not torch.cuda.is_available():
            report.update(error=f"torch {torch.__version__} sees no CUDA device", error_kind="no_device")
            save()
            return None
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        props = torch.cuda.get_device_properties(device)
        report.update(gpu_name=props.name, pci_bus_id=pci_bus_id(props), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    return torch, dist, device
