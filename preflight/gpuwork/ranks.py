"""One torchrun worker run, from launch to findings: what every check that
starts ranks shares (nccl, bandwidth, train).

A check builds a ``launch.Worker``, calls ``collect`` to run it and read each
rank's report into ``RunFacts``, then ``judge_run`` says how the ranks ended:
the rank that died, hung or never reported first, the ranks that then failed
waiting for it after. What the ranks measured is the check's own business.
"""

from __future__ import annotations

import math
import re
import time
from typing import Callable, ClassVar

from pydantic import BaseModel, Field, SerializeAsAny, ValidationError

from preflight.gpuwork import interpreter as interpreter_mod, launch, launch_output
from preflight.gpuwork.world import Worlds
from preflight.base.findings import Finding, Status
from preflight.base.progress import Progress

FAIL, WARN = Status.FAIL, Status.WARN
MARGIN = 3.0  # seconds kept from the check's deadline to sweep processes and judge
STUCK = 3.0  # once a rank has failed, a rank that reports no progress for this long is stuck
DONE_GRACE = 10.0  # after every rank reported success, the most their exit (NCCL teardown) may take
TORCH = "point --python at the training environment's interpreter, or install torch there"
OOM_HINT = "if no one killed it, look for the kernel's OOM killer (`journalctl -k | grep -i -e oom -e 'killed process'`); "
RESET_HINT = "check that GPU with `preflight run --only cuda` and `preflight xid`; reset it (`nvidia-smi -r -i N`) or reboot"


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


def judge_run(f: RunFacts, what: str, by_hand: str, wrong: list[Finding] | None = None, said: tuple[str, str, str] | None = None) -> list[Finding]:
    """Did every rank run to the end, in time, and leave nothing behind?

    ``what`` names the run ("the NCCL smoke test"); ``by_hand`` says how to
    run it by hand; ``wrong`` are the check's own findings about the answers
    the ranks gave; ``said`` is what the collective library said went wrong
    (title, line, fix), added to the cause of a failed run."""
    if f.launch_error:
        cause, remedy = f.launch_error
        return [Finding(FAIL, f"{what} could not start", cause, remedy)]
    if f.not_started or f.ended is None:
        return []
    out = []
    if f.leftover:
        cause = f"still running after SIGKILL: {', '.join(f.leftover)}; a process that survives SIGKILL is stuck in the kernel, usually in the GPU driver"
        out.append(Finding(FAIL, "worker processes outlived the check", cause, "drain the node and reboot it"))
    reports = [o.report for o in f.ranks if o.report]
    no_torch = next((r for r in reports if r.error_kind == "no_torch"), None)
    missing = [line for line in f.log_tail if re.search(r"No module named '?torch\b", line)]
    if no_torch or (not reports and missing):
        why = no_torch.error if no_torch and no_torch.error else missing[0]
        return out + [Finding(FAIL, "torch is not importable", f"torch is not importable by {f.python}: {why.strip()}", TORCH)]
    no_device = next((r for r in reports if r.error_kind == "no_device"), None)
    if no_device:
        lib = "NCCL" if f.backend == "nccl" else what
        return out + [Finding(FAIL, f"no CUDA device for {lib}", f"{no_device.error} (under {f.python})", "run the cuda check (`preflight run --only cuda`); " + TORCH)]
    if f.silent():
        # No rank said a word: torchrun itself failed (rendezvous, a port taken in a race) or was slow,
        # or --python is no Python at all (then it says so).
        last = " | ".join(f.log_tail[-3:]) or "none"
        ended = f"was {f.ended}" if f.timed_out else f"ended ({f.ended})"
        remedy = "raise the check's timeout in the profile's [timeouts] if this node is slow to import torch; " if f.timed_out else ""
        cause = f"torchrun {ended} before any rank started; its last output: {last}"
        if not_python := interpreter_mod.judge(f.python, f.interpreter, cause):
            return out + [not_python]
        return out + [Finding(FAIL, "torchrun never started the ranks", cause, remedy + by_hand)]
    out += _judge_ranks(f, by_hand, said)
    out += wrong or []
    if not out and f.settled and all(o.report and o.report.stage == "done" for o in f.ranks):
        cause = f"every rank reported success, but the ranks or torchrun had not exited {DONE_GRACE:g} s later (a hang in NCCL's teardown); they were stopped"
        out.append(Finding(WARN, "ranks did not exit after finishing", cause, "if it recurs, run the worker by hand with NCCL_DEBUG=INFO; " + by_hand))
    elif not out and (f.returncode != 0 or f.timed_out):
        cause = f"torchrun {f.ended} although every rank reported success; last output: {f.log_tail[-1] if f.log_tail else 'none'}"
        out.append(Finding(FAIL, "torchrun failed", cause, by_hand))
    return out


# A rank's end that says it waited for a peer past a deadline: its own (_rank.spin), gloo's,
# or the group's, where NCCL's watchdog caught the collective (and, unless told otherwise,
# ended the process with SIGABRT before it could write a word).
WAITED = re.compile(r"not done after|timed out|\btimeout\b|watchdog", re.IGNORECASE)
WATCHDOG = "NCCL's watchdog ends a rank whose collective outlives the group's timeout"


def waited(o: RankOutcome) -> bool:
    """Whether the rank ended waiting for a peer: a deadline's error, or NCCL's watchdog's SIGABRT."""
    r = o.report
    if r is not None and r.error:
        return bool(WAITED.search(r.error))
    return o.exit == "killed by SIGABRT"


def _judge_ranks(f: RunFacts, by_hand: str, said: tuple[str, str, str] | None) -> list[Finding]:
    """The ranks that died, hung or never reported are the cause; the ranks that
    then failed waiting for them are the symptom, said after. A hung rank (alive,
    no error, stopped reporting progress) is the cause before any rank that ended
    waiting past a deadline, even the one torchrun saw fail first: in a hang that is
    always a healthy peer whose wait timed out (or NCCL's watchdog killed)."""
    culprits: list[tuple[str, str, int, str | None, int]] = []  # (summary, what happened, rank, exit, steps done)
    failed: list[tuple[float, RankOutcome]] = []
    hung = any(o.report and not o.report.error and o.report.stage != "done" and not o.exit for o in f.ranks)
    victims = {o.rank for o in f.ranks if hung and waited(o)}
    for o in f.ranks:
        r = o.report
        if r is None:
            head = f"{o.who} never reported" + (f" ({o.exit})" if o.exit else "")
            culprits.append((head, head + (f"; {o.unreadable}" if o.unreadable else "") + f": last log line: {o.last_line}", o.rank, o.exit, -1))
        elif r.error:
            failed.append((r.error_time or math.inf, o))
        elif r.stage != "done":
            if o.exit and o.rank in victims:
                head = f"{o.who} then died {stage_words(r)} ({o.exit}: {WATCHDOG})"
                culprits.append((head, f"{head}: last log line: {o.last_line}", o.rank, "waited", r.progress()))
            elif o.exit:
                head = f"{o.who} died {stage_words(r)} ({o.exit})"
                culprits.append((head, f"{head}: last log line: {o.last_line}", o.rank, o.exit, r.progress()))
            else:
                others = "another rank failed" if any(x.report and x.report.error or x.exit for x in f.ranks) else "the other ranks finished"
                how = "at the deadline" if f.timed_out else f"once it made no progress after {others}" if f.settled else f"when torchrun ended ({f.ended})"
                if r.waiting and any(not (x.report and (x.report.waiting or x.report.stage == "done")) for x in f.ranks if x is not o):
                    # Waiting at a barrier for a peer that is not: a symptom, said after the cause.
                    head = f"{o.who} waited {stage_words(r)} at {r.waiting}"
                    culprits.append((head, f"{head} for the rank(s) that never came, and was stopped {how}", o.rank, "waited", r.progress()))
                    continue
                head = f"{o.who} hung {stage_words(r)}"
                culprits.append((head, f"{head} and was stopped {how}: last log line: {o.last_line}", o.rank, o.exit, r.progress()))
    failed.sort(key=lambda t: t[0])
    root = None if f.root_cause in victims else f.root_cause
    if failed and any(o.rank == root for _, o in failed):
        # torchrun names the first exit it saw in one of its polls (0.1 s apart); ranks that
        # raised both within one poll are told apart by their own clocks, which are finer.
        root = failed[0][1].rank
    # One list, most likely cause first: the rank torchrun saw fail first; then
    # ranks that hung, died by their own hand or never reported (least far
    # first); then ranks that raised (earliest error first) or that NCCL's watchdog
    # ended while a peer hung; last, ranks torchrun itself stopped (SIGTERM in its
    # teardown), which are victims.
    tier = {"killed by SIGTERM": 2, "waited": 1}
    entries = [(c[2] != root, tier.get(c[3] or "", 0), c[4], c[0], c[1]) for c in culprits]
    for i, (_, o) in enumerate(failed):
        head = f"{o.who} failed {stage_words(o.report)}"
        entries.append((o.rank != root, 1, i, head, f"{head}: {o.report.error}"))  # type: ignore[union-attr]
    if not entries:
        return []
    entries.sort(key=lambda e: e[:3])
    summary, lead = entries[0][3], entries[0][4]
    if entries[0][1] == 1:
        lead = lead.replace(" failed ", " failed first, ", 1)
    rest = [e[4].replace(" failed ", " then failed ", 1) if e[1] == 1 else e[4] for e in entries[1:]]
    cause = "; ".join([lead, *rest])
    if said:
        title, text, fix = said
        return [Finding(FAIL, summary, f"{cause}; NCCL said ({title}): {text.strip()}", f"{fix}; {by_hand}")]
    # A SIGKILL no one sent by hand is most often the kernel's OOM killer, which says so in its log.
    oom = OOM_HINT if "(killed by SIGKILL)" in summary else ""
    return [Finding(FAIL, summary, cause, f"{oom}{RESET_HINT if f.backend == 'nccl' else 'look at that rank'}; {by_hand}")]


def stage_words(r: RankReport | None) -> str:
    if r is None:
        return ""
    fixed = {"import": "importing torch", "init": "in init_process_group", "build": "building the model", "done": "after finishing"}
    return fixed.get(r.stage, f"in {r.stage} ({r.step_noun} {r.progress() + 1})")
