"""One torchrun worker run, from launch to findings: what every check that
starts ranks shares (nccl, bandwidth, train).

A check builds a ``launch.Worker``, calls ``collect`` to run it and read each
rank's report into ``RunFacts``, then ``ranks_judge.judge_run`` (gpuwork/ranks_judge.py)
says how the ranks ended: the rank that died, hung or never reported first, the ranks
that then failed waiting for it after. What the ranks measured is the check's own business.
"""

from __future__ import annotations

import math
import time
from typing import Callable, ClassVar

from pydantic import BaseModel, Field, SerializeAsAny, ValidationError

from preflight.gpuwork import interpreter as interpreter_mod, launch, launch_output
from preflight.gpuwork.world import Worlds
from preflight.base.progress import Progress

MARGIN = 3.0  # seconds kept from the check's deadline to sweep processes and judge
STUCK = 3.0  # once a rank has failed, a rank that reports no progress for this long is stuck
DONE_GRACE = 10.0  # after every rank reported success, the most their exit (NCCL teardown) may take
TORCH = "point --python at the training environment's interpreter, or install torch there"


class RankReport(BaseModel):
    """The fields every worker's rank{N}.json has (checks/workers/_rank.py); a check extends it."""

    step_noun: ClassVar[str] = "step"  # "in hbm_copy (step 2)"

    rank: int
    local_rank: int
    world_size: int
    host: str
    node_rank: int = 0  # preflight's node rank in a group (PREFLIGHT_NODE_RANK)
    pid: int
    python: str
    stage: str  # import, init, the step under way, done
    error: str | None = None
    error_kind: str | None = None  # no_torch, no_device
    error_time: float | None = None  # time.time() of the error: the first one is the root cause
    backend: str
    device: str
    torch_version: str | None = None
    gpu_name: str | None = None
    pci_bus_id: str | None = None
    import_seconds: float | None = None
    init_seconds: float | None = None
    seconds: float | None = None
    traceback: list[str] = Field(default_factory=list)
    # Where the rank waits for its peers (bandwidth's barrier between turns); None: it does not.
    # A rank hung there is the symptom of the one it waits for.
    waiting: str | None = None

    def progress(self) -> int:
        """Steps finished: where in its plan the rank stopped."""
        return 0


class RankOutcome(BaseModel):
    rank: int  # the local rank: which of this node's files and GPUs
    gpu: str | None  # "GPU 3" (nvidia-smi's index), None on CPU
    global_rank: int | None = None  # across nodes, the rank in the whole group
    node: str | None = None  # across nodes: "node 1 (gpu-node-17)"
    report: SerializeAsAny[RankReport] | None = None
    unreadable: str | None = None
    exit: str | None = None  # from torchrun's summary: "killed by SIGKILL"
    last_line: str = "none"

    @property
    def who(self) -> str:
        rank = self.rank if self.global_rank is None else self.global_rank
        return f"rank {rank}" + (f" ({self.gpu})" if self.gpu else "") + (f" on {self.node}" if self.node else "")


class RunFacts(BaseModel):
    """How one torchrun run went, rank by rank."""

    python: str
    backend: str  # nccl or gloo
    nproc: int
    not_started: str | None = None  # why nothing was launched
    launch_error: tuple[str, str] | None = None  # (cause, remedy)
    endpoint: str | None = None
    ended: str | None = None
    returncode: int | None = None
    timed_out: bool = False
    settled: bool = False
    seconds: float | None = None
    log_tail: list[str] = Field(default_factory=list)
    leftover: list[str] = Field(default_factory=list)
    root_cause: int | None = None  # the rank torchrun saw fail first
    world: dict | None = None  # a stage of the run's shared launch: {"launch": N, "stage": K, "ended_it": bool}
    isolation: dict | None = None  # where the ranks' sockets lived: {"network": "private"}, or "host" and why
    ranks: list[RankOutcome] = Field(default_factory=list)
    # Asked only where no rank said a word: whether the interpreter is a Python at all.
    interpreter: interpreter_mod.Answer | None = None

    def silent(self) -> bool:
        """No rank said a word or died of its own: torchrun never got them going. A rank
        torchrun stopped in its teardown (SIGTERM) is no sign it ever ran."""
        return not any(o.report or o.last_line != "none" or (o.exit and o.exit != "killed by SIGTERM") for o in self.ranks)


def count(f: RunFacts) -> str:
    """"2 gloo rank(s)", or across nodes "8 gloo ranks on 4 nodes (2 here)"."""
    world = max((o.report.world_size for o in f.ranks if o.report), default=f.nproc)
    if world > f.nproc:
        return f"{world} {f.backend} ranks on {world // f.nproc} nodes ({f.nproc} here)"
    return f"{f.nproc} {f.backend} rank(s)"


def time_left(deadline: float) -> float:
    """Seconds the launcher may use: the check's deadline less the margin to judge,
    so the check itself names the stuck rank."""
    return max(1.0, deadline - time.monotonic() - MARGIN) if math.isfinite(deadline) else 120.0


def gpu_of(local_rank: int, env: dict[str, str], backend: str) -> str | None:
    """nvidia-smi's index of the GPU a local rank drives: CUDA_DEVICE_ORDER=PCI_BUS_ID
    makes CUDA's N nvidia-smi's N, unless CUDA_VISIBLE_DEVICES renumbers."""
    if backend != "nccl":
        return None
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if "CUDA_VISIBLE_DEVICES" in env:
        if local_rank < len(visible) and visible[local_rank].isdigit():
            return f"GPU {visible[local_rank]}"
        return f"CUDA device {local_rank}"
    return f"GPU {local_rank}"


def by_hand(f: RunFacts, script: str) -> str:
    """The torchrun command that reruns ``script`` as the check ran it, to see more."""
    extra = " --backend gloo --device cpu" if f.backend == "gloo" else ""
    return f"run it by hand to see more: {f.python} -m torch.distributed.run --nproc-per-node {f.nproc} {launch.WORKERS_DIR / script}{extra}"


def _inventory(results: dict) -> list[dict]:
    """The GPUs of the cuda check's NVML inventory, when it ran."""
    cuda = results.get("cuda")
    return ((cuda.details.get("inventory") or {}).get("gpus") or []) if cuda else []


def gpu_uuids(results: dict) -> dict[int, str]:
    """nvidia-smi index -> GPU UUID, from the cuda check's inventory when it ran."""
    return {g["index"]: g["uuid"] for g in _inventory(results) if "index" in g and "uuid" in g}


def gpu_buses(results: dict) -> dict[int, str]:
    """nvidia-smi index -> PCI bus id as NVML prints it, from the cuda check's inventory when it ran."""
    return {g["index"]: g["pci_bus_id"] for g in _inventory(results) if "index" in g and g.get("pci_bus_id")}


def compute_modes(results: dict) -> dict[int, str | None] | None:
    """nvidia-smi index -> NVML's compute mode, from the cuda check's inventory; None where it did not run."""
    return {g["index"]: g.get("compute_mode") for g in _inventory(results) if "index" in g} or None


def labels(rank: int, gpu: str | None, uuids: dict[int, str]) -> dict[str, str]:
    """A rank's metric labels: dcgm-exporter's `gpu` and `UUID` (so joins work), or `rank` on CPU."""
    index = gpu_index(gpu)
    if index is None:
        return {"rank": str(rank)}
    return {"gpu": str(index), **({"UUID": uuids[index]} if index in uuids else {})}


def gpu_index(gpu: str | None) -> int | None:
    """"GPU 3" -> 3 (nvidia-smi's index); None where the GPU is not known by index."""
    return int(gpu.split()[1]) if gpu and gpu.startswith("GPU ") and gpu.split()[1].isdigit() else None


def settle_rule(nproc: int, stuck: float, waiting: float) -> Callable[[launch.Running], bool]:
    """Once a rank has failed, the rest either fail fast or never move again:
    stop as soon as every rank still alive has shown no progress for ``stuck``
    seconds in a step, or ``waiting`` seconds while importing torch or in
    init (which report nothing while they work, and take seconds when healthy).
    Once a rank has finished, a rank that then shows no progress for ``waiting``
    seconds (the longest a wait may take, and some) is hung: the stage does not wait
    for its deadline where nothing waits on the hung rank (burn-in, memtest), nor where
    a peer's own deadline has no collective left to fire in."""
    seen: dict[int, tuple[object, float]] = {}
    finished: list[float] = []  # when a rank was first seen done

    def settled(running: launch.Running) -> bool:
        now = time.monotonic()
        reports = {r: running.report(r) or {} for r in range(nproc)}
        for r, rep in reports.items():
            key = (rep.get("stage"), len(rep.get("ops") or []), rep.get("step"), rep.get("error"))
            if seen.get(r, (None,))[0] != key:
                seen[r] = (key, now)
        if all(rep.get("stage") == "done" for rep in reports.values()):
            # Every rank reported success; a teardown that never ends must not wait for the deadline.
            return all(now - seen[r][1] >= DONE_GRACE for r in reports)
        if not finished and any(rep.get("stage") == "done" for rep in reports.values()):
            finished.append(now)
        if not any(rep.get("error") for rep in reports.values()):
            # Counted from the finish, not from the last progress: a healthy rank may have been
            # in one long step (a GEMM series, a memtest pass) when its peer finished.
            return bool(finished) and all(rep.get("stage") == "done" or now - max(seen[r][1], finished[0]) >= waiting for r, rep in reports.items())

        def idle(r: int, rep: dict) -> bool:
            limit = waiting if rep.get("stage") in (None, "import", "init", "build") else stuck
            return now - seen[r][1] >= limit

        return all(rep.get("error") or rep.get("stage") == "done" or idle(r, rep) for r, rep in reports.items())

    return settled


def waited_out(nproc: int, op_timeout: float) -> Callable[[launch.Running], bool]:
    """settle_rule for ranks whose every wait has ``op_timeout`` as its deadline (nccl,
    bandwidth, train): a rank left waiting for a hung peer fails by its own deadline
    and says so, so a rank is hung only once it has been silent for longer than that.
    Sooner, a rank still inside its own wait (of three ranks, the second one waiting
    for the first that stopped) would be named hung beside the one that is."""
    return settle_rule(nproc, op_timeout + STUCK, op_timeout + STUCK)


def collect(f: RunFacts, worker: launch.Worker, model: type[RankReport], env: dict[str, str], left: float, settled, progress: Progress | None = None,
            worlds: Worlds | None = None) -> launch_output.Finished | None:
    """Run ``worker`` under ``f.python`` within ``left`` seconds and fill ``f``
    with how each rank ended; None (and ``f.launch_error``) if it never started.
    ``progress`` (the Context's) shows the ranks' stages while they run. Given the
    run's ``worlds``, the worker runs as a stage of the launch they keep (gpuwork/world.py)."""
    try:
        running = worlds.stage(f.python, worker, left, progress) if worlds is not None else launch.start(f.python, worker, left, progress)
    except launch.LaunchError as e:
        f.launch_error = (e.cause, e.remedy)
        return None
    except OSError as e:
        f.launch_error = (f"{f.python} could not be started: {e.strerror or e}", TORCH)
        return None
    done = running.wait(settled)
    f.endpoint, f.ended, f.returncode = done.endpoint, done.how_it_ended, done.returncode
    f.timed_out, f.settled, f.seconds = done.timed_out, done.settled, round(done.seconds, 3)
    f.log_tail, f.leftover, f.root_cause, f.world = done.log_tail, done.leftover, done.root_cause, done.world
    f.isolation = done.isolation
    for r in range(f.nproc):
        outcome = RankOutcome(rank=r, gpu=gpu_of(r, env, f.backend), last_line=done.last_line(r))
        if r in done.rank_exits:
            outcome.exit = launch_output.exit_words(done.rank_exits[r])
        if r in done.reports:
            try:
                outcome.report = model.model_validate(done.reports[r])
                if outcome.report.world_size > f.nproc:  # a group of nodes: say which rank of it, on which node
                    outcome.global_rank, outcome.node = outcome.report.rank, f"node {outcome.report.node_rank} ({outcome.report.host})"
            except ValidationError as e:
                err = e.errors()[0]
                outcome.unreadable = f"its report does not fit the expected shape ({'.'.join(map(str, err['loc']))}: {err['msg']})"
        else:
            outcome.unreadable = done.unreadable.get(r)
        f.ranks.append(outcome)
    # An interpreter that is no Python ends torchrun at once, by itself. Not asked where torchrun was
    # stopped (a deadline: a slow torch import; a signal: the run is ending) or any rank spoke.
    if f.silent() and not f.timed_out and f.returncode is not None and f.returncode >= 0:
        f.interpreter = interpreter_mod.ask(f.python)
    return done
