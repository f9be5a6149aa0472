"""NCCL smoke test: torchrun on every GPU, the job's own collectives checked
for the right answer, NCCL's choice of transport read from its own log, and
a deadline that names the rank when anything hangs or dies.

What a hand-rolled `init_process_group` + all_reduce script misses, and this
check does not: a dead peer (that script waits NCCL's 10 minutes), a wrong
or stale result (it never compares), NVLink peers that fell back to SHM or
sockets (it never looks), and debugging switches left in the environment.
On the cpu profile the same launcher, worker and judges run with gloo.
"""

from __future__ import annotations

import math
import re
import socket
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil
from pydantic import BaseModel, Field, ValidationError

from preflight import launch, nccl_env, nccl_log
from preflight.check import Check, Context, Finding, Measurement, Result, Status, worst
from preflight.host import Host
from preflight.profiles import NcclExpect
from preflight.units import fmt_bytes, fmt_seconds

FAIL, WARN = Status.FAIL, Status.WARN
MARGIN = 3.0  # seconds kept from the check's deadline to sweep processes and judge
STUCK = 3.0  # once a rank has failed, a rank that reports no progress for this long is stuck
DONE_GRACE = 10.0  # after every rank reported success, the most their exit (NCCL teardown) may take
TORCH = "point --python at the training environment's interpreter, or install torch there"


class OpResult(BaseModel):
    name: str  # all_reduce_fp32_small
    op: str
    dtype: str | None = None
    bytes: int
    seconds: float | None = None
    error: str | None = None  # a wrong answer, described
    skipped: str | None = None


class RankReport(BaseModel):
    """What checks/workers/nccl_smoke.py writes for one rank."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    python: str
    stage: str  # import, init, the op under way, done
    error: str | None = None
    error_kind: str | None = None  # no_torch, no_device
    error_time: float | None = None  # time.time() of the error: the first one is the root cause
    backend: str
    device: str
    torch_version: str | None = None
    nccl_version: str | None = None
    gpu_name: str | None = None
    pci_bus_id: str | None = None
    import_seconds: float | None = None
    init_seconds: float | None = None
    first_collective_seconds: float | None = None
    ops: list[OpResult] = Field(default_factory=list)
    seconds: float | None = None
    traceback: list[str] = Field(default_factory=list)


class RankOutcome(BaseModel):
    rank: int
    gpu: str | None  # "GPU 3" (nvidia-smi's index), None on CPU
    report: RankReport | None = None
    unreadable: str | None = None
    exit: str | None = None  # from torchrun's summary: "killed by SIGKILL"
    last_line: str = "none"

    @property
    def who(self) -> str:
        return f"rank {self.rank}" + (f" ({self.gpu})" if self.gpu else "")


class NcclFacts(BaseModel):
    python: str
    backend: str  # nccl or gloo
    nproc: int
    env: dict[str, list[tuple[str, str]]] = Field(default_factory=dict)  # NCCL_*/GLOO_* -> [(value, where)]
    interfaces: dict[str, list[str] | None] | None = None  # name -> addresses (None: unknown); None: not read
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
    ranks: list[RankOutcome] = Field(default_factory=list)
    nccl: nccl_log.NcclLog | None = None


# ---- gathering -------------------------------------------------------------


def interfaces(host: Host) -> dict[str, list[str] | None] | None:
    """Network interfaces -> their IP addresses (None: not known). The live
    machine's from getifaddrs; under a recorded root, the names in sysfs."""
    if host.root == Path("/"):
        try:
            ip = (socket.AF_INET, socket.AF_INET6)
            return {name: [a.address for a in addrs if a.family in ip] for name, addrs in psutil.net_if_addrs().items()}
        except OSError:
            return None
    try:
        return {p.name: None for p in host.path("/sys/class/net").iterdir()}
    except OSError:
        return None


def _gpu_of(local_rank: int, env: dict[str, str], backend: str) -> str | None:
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


def settle_rule(nproc: int, stuck: float, waiting: float):
    """Once a rank has failed, the rest either fail fast or never move again:
    stop as soon as every rank still alive has shown no progress for ``stuck``
    seconds in an op, or ``waiting`` seconds while importing torch or in
    init (which report nothing while they work, and take seconds when healthy)."""
    seen: dict[int, tuple[object, float]] = {}

    def settled(running: launch.Running) -> bool:
        now = time.monotonic()
        reports = {r: running.report(r) or {} for r in range(nproc)}
        for r, rep in reports.items():
            key = (rep.get("stage"), len(rep.get("ops") or []), rep.get("error"))
            if seen.get(r, (None,))[0] != key:
                seen[r] = (key, now)
        if all(rep.get("stage") == "done" for rep in reports.values()):
            # Every rank reported success; a teardown that never ends must not wait for the deadline.
            return all(now - seen[r][1] >= DONE_GRACE for r in reports)
        if not any(rep.get("error") for rep in reports.values()):
            return False

        def idle(r: int, rep: dict) -> bool:
            limit = waiting if rep.get("stage") in (None, "import", "init") else stuck
            return now - seen[r][1] >= limit

        return all(rep.get("error") or rep.get("stage") == "done" or idle(r, rep) for r, rep in reports.items())

    return settled


def gather(ctx: Context, nproc: int, expect: NcclExpect, backend: str) -> NcclFacts:
    host = ctx.host
    python = str(ctx.settings.python) if ctx.settings.python else sys.executable
    facts = NcclFacts(python=python, backend=backend, nproc=nproc, env=nccl_env.read(host), interfaces=interfaces(host))
    if bad := judge_ifnames(facts.env, facts.interfaces):
        facts.not_started = bad[0].cause  # a bad interface name fails every rank: say so before launching
        return facts
    # The launcher's deadline comes first, so the check itself names the stuck rank.
    left = max(1.0, ctx.deadline - time.monotonic() - MARGIN) if math.isfinite(ctx.deadline) else 120.0
    # Ranks give up on a stuck peer well before the deadline, so they live to say who it was.
    op_timeout = min(expect.op_timeout_seconds, max(2.0, left / 3))
    device = "cuda" if backend == "nccl" else "cpu"
    args = ["--backend", backend, "--device", device, "--small-bytes", str(expect.small_bytes), "--large-bytes", str(expect.large_bytes), "--timeout", f"{op_timeout:g}"]
    if backend == "nccl":
        args.append("--nccl-debug")
    worker = launch.Worker("nccl_smoke.py", args, nproc=nproc, rdzv_port=ctx.settings.rdzv_port)
    try:
        running = launch.start(python, worker, left)
    except launch.LaunchError as e:
        facts.launch_error = (e.cause, e.remedy)
        return facts
    except OSError as e:
        facts.launch_error = (f"{python} could not be started: {e.strerror or e}", TORCH)
        return facts
    done = running.wait(settle_rule(nproc, STUCK, op_timeout + STUCK))
    facts.endpoint, facts.ended, facts.returncode = done.endpoint, done.how_it_ended, done.returncode
    facts.timed_out, facts.settled, facts.seconds = done.timed_out, done.settled, round(done.seconds, 3)
    facts.log_tail, facts.leftover, facts.root_cause = done.log_tail, done.leftover, done.root_cause
    for r in range(nproc):
        outcome = RankOutcome(rank=r, gpu=_gpu_of(r, host.environ, backend), last_line=done.last_line(r))
        if r in done.rank_exits:
            outcome.exit = launch.exit_words(done.rank_exits[r])
        if r in done.reports:
            try:
                outcome.report = RankReport.model_validate(done.reports[r])
            except ValidationError as e:
                err = e.errors()[0]
                outcome.unreadable = f"its report does not fit the expected shape ({'.'.join(map(str, err['loc']))}: {err['msg']})"
        else:
            outcome.unreadable = done.unreadable.get(r)
        facts.ranks.append(outcome)
    texts = [done.texts[name] for name in sorted(done.texts) if name.startswith("nccl.")]
    if texts:
        facts.nccl = nccl_log.parse("\n".join(texts))
    return facts


# ---- judging ---------------------------------------------------------------


def judge_env(env: dict[str, list[tuple[str, str]]]) -> list[Finding]:
    return [
        Finding(WARN, f"{name}={value} is set", f"{name}={value} in {where} {cost}", f"unset {name} (a debugging switch) in {where}")
        for name, value, where, cost in nccl_env.switches_on(env)
    ]


def _ifname_matches(spec: str, names: list[str], exact_only: bool) -> tuple[list[str], list[str]]:
    """(the interfaces a *_SOCKET_IFNAME value selects, the entries that select none).
    NCCL's form: "^" excludes, "=" matches exactly, otherwise prefixes; gloo's: exact names."""
    body = spec.strip()
    exclude = body.startswith("^") and not exact_only
    body = body[1:] if exclude else body
    exact = exact_only or body.startswith("=")
    entries = [e.strip() for e in body.removeprefix("=").split(",") if e.strip()]
    hit = lambda e, n: n == e if exact else n.startswith(e)  # noqa: E731
    if exclude:
        return [n for n in names if not any(hit(e, n) for e in entries)], []
    return [n for n in names if any(hit(e, n) for e in entries)], [e for e in entries if not any(hit(e, n) for n in names)]


def judge_ifnames(env: dict[str, list[tuple[str, str]]], nics: dict[str, list[str] | None] | None) -> list[Finding]:
    """A *_SOCKET_IFNAME that selects no usable interface fails every rank at init, after a wait.
    NCCL uses every interface its list matches and ignores values under two
    characters (ncclFindInterfaces); gloo wants each name it is given to exist."""
    if nics is None:
        return []
    out = []
    known = ", ".join(sorted(nics)) or "none"
    for name, exact_only in (("NCCL_SOCKET_IFNAME", False), ("GLOO_SOCKET_IFNAME", True)):
        value, where = nccl_env.effective(env).get(name, (None, None))
        if value is None or len(value.strip()) < (1 if exact_only else 2):
            continue
        chosen, unmatched = _ifname_matches(value, sorted(nics), exact_only)
        fix = f"set {name} to an interface this node has ({known}), or unset it"
        if not chosen or (exact_only and unmatched):
            missing = ", ".join(unmatched) or value
            cause = f"{name}={value} (in {where}) names no interface on this node ({missing}); it has {known}: every rank would fail to open its sockets"
            out.append(Finding(FAIL, f"{name} names a missing interface", cause, fix))
        elif all(nics[n] == [] for n in chosen):
            cause = f"{name}={value} (in {where}) selects {', '.join(chosen)}, which has no IP address: ranks cannot bind a socket there"
            out.append(Finding(FAIL, f"{name} selects an interface without an address", cause, fix))
        elif unmatched:
            cause = f"{name}={value} (in {where}): {', '.join(unmatched)} match no interface on this node; NCCL uses {', '.join(chosen)}"
            out.append(Finding(WARN, f"{name} names an interface this node lacks", cause, f"drop {', '.join(unmatched)} from {name} if the fleet no longer has it"))
    return out


def _by_hand(f: NcclFacts) -> str:
    script = launch.WORKERS_DIR / "nccl_smoke.py"
    extra = " --backend gloo --device cpu" if f.backend == "gloo" else ""
    return f"run it by hand to see more: {f.python} -m torch.distributed.run --nproc-per-node {f.nproc} {script}{extra}"


def judge_run(f: NcclFacts) -> list[Finding]:
    """Did every rank run every op to the right answer, in time, and leave nothing behind?"""
    if f.launch_error:
        cause, remedy = f.launch_error
        return [Finding(FAIL, "the NCCL smoke test could not start", cause, remedy)]
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
        why = no_torch.error if no_torch else missing[0]
        return out + [Finding(FAIL, "torch is not importable", f"torch is not importable by {f.python}: {why.strip()}", TORCH)]
    no_device = next((r for r in reports if r.error_kind == "no_device"), None)
    if no_device:
        return out + [Finding(FAIL, "no CUDA device for NCCL", f"{no_device.error} (under {f.python})", "run the cuda check (`preflight run --only cuda`); " + TORCH)]
    if not any(o.report or o.last_line != "none" for o in f.ranks):
        # No rank said a word: torchrun itself failed (rendezvous, a port taken in a race) or was slow.
        said = " | ".join(f.log_tail[-3:]) or "none"
        ended = f"was {f.ended}" if f.timed_out else f"ended ({f.ended})"
        remedy = "raise the nccl timeout in the profile's [timeouts] if this node is slow to import torch; " if f.timed_out else ""
        cause = f"torchrun {ended} before any rank started; its last output: {said}"
        return out + [Finding(FAIL, "torchrun never started the ranks", cause, remedy + _by_hand(f))]
    out += _judge_ranks(f)
    out += _judge_answers(f)
    if not out and f.settled and all(o.report and o.report.stage == "done" for o in f.ranks):
        cause = f"every rank reported success, but the ranks or torchrun had not exited {DONE_GRACE:g} s later (a hang in NCCL's teardown); they were stopped"
        out.append(Finding(WARN, "ranks did not exit after finishing", cause, "if it recurs, run the worker by hand with NCCL_DEBUG=INFO; " + _by_hand(f)))
    elif not out and (f.returncode != 0 or f.timed_out):
        cause = f"torchrun {f.ended} although every rank reported success; last output: {f.log_tail[-1] if f.log_tail else 'none'}"
        out.append(Finding(FAIL, "torchrun failed", cause, _by_hand(f)))
    return out


def _judge_ranks(f: NcclFacts) -> list[Finding]:
    """The ranks that died, hung or never reported are the cause; the ranks that
    then failed waiting for them are the symptom, said after."""
    culprits: list[tuple[str, str, int, str | None, int]] = []  # (summary, what happened, rank, exit, ops done)
    failed: list[tuple[float, RankOutcome]] = []
    for o in f.ranks:
        r = o.report
        if r is None:
            head = f"{o.who} never reported" + (f" ({o.exit})" if o.exit else "")
            culprits.append((head, head + (f"; {o.unreadable}" if o.unreadable else "") + f": last log line: {o.last_line}", o.rank, o.exit, -1))
        elif r.error:
            failed.append((r.error_time or math.inf, o))
        elif r.stage != "done":
            if o.exit:
                head = f"{o.who} died {_stage_words(r)} ({o.exit})"
                culprits.append((head, f"{head}: last log line: {o.last_line}", o.rank, o.exit, len(r.ops)))
            else:
                how = "at the deadline" if f.timed_out else "once it made no progress after another rank failed" if f.settled else f"when torchrun ended ({f.ended})"
                head = f"{o.who} hung {_stage_words(r)}"
                culprits.append((head, f"{head} and was stopped {how}: last log line: {o.last_line}", o.rank, o.exit, len(r.ops)))
    failed.sort(key=lambda t: t[0])
    # One list, most likely cause first: the rank torchrun saw fail first; then
    # ranks that hung, died by their own hand or never reported (least far
    # first); then ranks that raised (earliest error first); last, ranks
    # torchrun itself stopped (SIGTERM in its teardown), which are victims.
    entries = [(c[2] != f.root_cause, 2 if c[3] == "killed by SIGTERM" else 0, c[4], c[0], c[1]) for c in culprits]
    for i, (_, o) in enumerate(failed):
        r = o.report
        head = f"{o.who} failed {_stage_words(r)}"
        entries.append((o.rank != f.root_cause, 1, i, head, f"{head}: {r.error}"))  # type: ignore[union-attr]
    if not entries:
        return []
    entries.sort(key=lambda e: e[:3])
    summary, lead = entries[0][3], entries[0][4]
    if entries[0][1] == 1:
        lead = lead.replace(" failed ", " failed first, ", 1)
    rest = [e[4].replace(" failed ", " then failed ", 1) if e[1] == 1 else e[4] for e in entries[1:]]
    cause = "; ".join([lead, *rest])
    if f.nccl and f.nccl.problems:
        p = f.nccl.problems[0]
        cause += f"; NCCL said ({p.title}): {p.text.strip()}"
        return [Finding(FAIL, summary, cause, f"{p.fix}; {_by_hand(f)}")]
    return [Finding(FAIL, summary, cause, f"{RESET_HINT if f.backend == 'nccl' else 'look at that rank'}; {_by_hand(f)}")]


RESET_HINT = "check that GPU with `preflight run --only cuda` and `preflight xid`; reset it (`nvidia-smi -r -i N`) or reboot"


def _stage_words(r: RankReport | None) -> str:
    if r is None:
        return ""
    return {"import": "importing torch", "init": "in init_process_group", "done": "after finishing"}.get(r.stage, f"in {r.stage} (op {len(r.ops) + 1})")


def _judge_answers(f: NcclFacts) -> list[Finding]:
    wrong: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for o in f.ranks:
        for op in o.report.ops if o.report else []:
            if op.error:
                wrong[op.name].append((o.rank, op.error))
    out = []
    for name, hits in wrong.items():
        ranks = ", ".join(str(r) for r, _ in hits)
        cause = f"{name} returned wrong values on rank(s) {ranks}: {hits[0][1]}"
        if f.backend == "nccl":
            remedy = "drain the node and run `dcgmi diag -r 3` on it: a collective that returns wrong data is a GPU, NVLink or driver fault"
        else:
            remedy = "a bug in the collective library or the worker: report it"
        out.append(Finding(FAIL, f"{name} returned wrong values", cause, remedy))
    return out


def judge_timing(f: NcclFacts, expect: NcclExpect) -> list[Finding]:
    inits = [(o.report.init_seconds, o) for o in f.ranks if o.report and o.report.init_seconds is not None]
    if not inits:
        return []
    slowest, o = max(inits, key=lambda t: t[0])
    if slowest <= expect.init_warn_seconds:
        return []
    cause = f"init_process_group took {slowest:.1f} s on {o.who}, over the {expect.init_warn_seconds:g} s a healthy node needs ({expect.init_source})"
    remedy = "check name resolution and NCCL_SOCKET_IFNAME (bootstrap), and GPU health on that rank; NCCL_DEBUG=INFO shows the init timings"
    return [Finding(WARN, f"slow {f.backend.upper()} init ({slowest:.1f} s)", cause, remedy)]


def judge_transports(f: NcclFacts, expect: NcclExpect, nvlink_pairs: set[frozenset[int]], switch_pairs: set[frozenset[int]] | None = None) -> list[Finding]:
    """Two ranks on this node should talk P2P (or NVLS). SHM between GPUs with
    NVLink fails; elsewhere it earns the profile's ``p2p`` status, but where
    the topology is known only for GPUs under one PCIe switch (``switch_pairs``:
    PIX/PXB), since NCCL's default P2P level stops at PXB on purpose. A network
    between two ranks of one node always fails."""
    if f.nccl is None:
        return []
    hosts = {o.rank: o.report.host for o in f.ranks if o.report}
    gpu = {o.rank: o.gpu for o in f.ranks}
    out: list[Finding] = []
    by_status: dict[Status, list[str]] = defaultdict(list)
    for (a, b), transports in sorted(f.nccl.peers().items()):
        if hosts.get(a) is None or hosts.get(a) != hosts.get(b):
            continue  # across nodes a network is right; unknown ranks cannot be judged
        kinds = {t.split("/")[0] for t in transports}
        if kinds <= {"P2P", "NVLS"}:
            continue
        pair = f"rank {a} ({gpu.get(a)}) -> rank {b} ({gpu.get(b)}) via {', '.join(transports)}"
        ga, gb = _gpu_index(gpu.get(a)), _gpu_index(gpu.get(b))
        nvlinked = ga is not None and gb is not None and frozenset((ga, gb)) in nvlink_pairs
        if "NET" in kinds:
            by_status[FAIL].append(pair)
        elif nvlinked or expect.p2p == "fail":
            by_status[FAIL].append(pair)
        elif expect.p2p == "warn" and (switch_pairs is None or (ga is not None and gb is not None and frozenset((ga, gb)) in switch_pairs)):
            by_status[WARN].append(pair)
    switches = [f"{name}={value}" for name, value, _, _ in nccl_env.switches_on(f.env) if name != "NCCL_IB_DISABLE"]
    hint = f" ({', '.join(switches)} set)" if switches else ""
    for status, pairs in by_status.items():
        shown = "; ".join(pairs[:4]) + (f"; and {len(pairs) - 4} more" if len(pairs) > 4 else "")
        cause = f"{len(pairs)} pair(s) of GPUs on this node do not use P2P{hint}: {shown}; {expect.p2p_source or ''}".rstrip("; ")
        remedy = (
            "unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL; check NVLink (`nvidia-smi nvlink -s`) and nvidia-fabricmanager; "
            "in a container allow IPC (--ipc=host); disable PCI ACS / IOMMU translation for P2P over PCIe"
        )
        out.append(Finding(status, f"GPUs fall back from P2P ({len(pairs)} pairs)", cause, remedy))
    return out


def judge_log(f: NcclFacts, run_failed: bool) -> list[Finding]:
    """NCCL's own warnings on a run that otherwise passed (a failed run names them in its cause)."""
    if f.nccl is None or run_failed:
        return []
    out = [Finding(WARN, f"NCCL: {p.title}", f"{p.cause} (line: {p.text.strip()})", p.fix) for p in f.nccl.problems]
    if not out and f.nccl.warnings:
        w = f.nccl.warnings[0]
        out.append(Finding(WARN, f"NCCL warned {len(f.nccl.warnings)} time(s)", f"NCCL WARN {w.message}", "read the NCCL warnings in the report's details (nccl.warnings)"))
    return out


def judge(f: NcclFacts, expect: NcclExpect, nvlink_pairs: set[frozenset[int]], switch_pairs: set[frozenset[int]] | None = None) -> dict[str, list[Finding]]:
    run = judge_run(f)
    return {
        "environment": judge_env(f.env) + judge_ifnames(f.env, f.interfaces),
        "run": run,
        "timing": judge_timing(f, expect),
        "transports": judge_transports(f, expect, nvlink_pairs, switch_pairs),
        "log": judge_log(f, any(x.status == FAIL for x in run)),
    }


# ---- reporting ---------------------------------------------------------------


def op_table(f: NcclFacts) -> dict[str, dict[str, float]]:
    """op (all_reduce_fp32...) -> size (small/large) -> slowest rank's seconds."""
    table: dict[str, dict[str, float]] = defaultdict(dict)
    for o in f.ranks:
        for op in o.report.ops if o.report else []:
            if op.seconds is not None:
                size = "large" if op.name.endswith("_large") else "small" if op.name.endswith("_small") else "none"
                base = op.name.removesuffix("_large").removesuffix("_small")
                table[base][size] = max(op.seconds, table[base].get(size, 0.0))
    return table


def lines(f: NcclFacts, expect: NcclExpect) -> list[str]:
    """Per-op figures for the console: the slowest rank's time at each message size."""
    table = op_table(f)
    if not table:
        return []
    out = [f"slowest rank per op: small = {fmt_bytes(expect.small_bytes)}, large = {fmt_bytes(expect.large_bytes)}"]
    for base, times in table.items():
        out.append(f"  {base:<16} " + "  ".join(f"{size} {fmt_seconds(sec)}" if size != "none" else fmt_seconds(sec) for size, sec in times.items()))
    return out


def measurements(f: NcclFacts, expect: NcclExpect) -> list[Measurement]:
    out = []
    reports = [o.report for o in f.ranks if o.report]
    inits = [r.init_seconds for r in reports if r.init_seconds is not None]
    firsts = [r.first_collective_seconds for r in reports if r.first_collective_seconds is not None]
    if inits:
        out.append(Measurement(name="nccl_init_duration", unit="seconds", value=max(inits), ceiling=expect.init_warn_seconds))
    if firsts:
        out.append(Measurement(name="nccl_first_collective_duration", unit="seconds", value=max(firsts)))
    for base, times in op_table(f).items():
        for size, seconds in times.items():
            out.append(Measurement(name="nccl_op_duration", unit="seconds", value=seconds, labels={"op": base, "size": size}))
    return out


def summary(f: NcclFacts, expect: NcclExpect) -> str:
    reports = [o.report for o in f.ranks if o.report]
    r0 = reports[0] if reports else None
    n_ops = len(r0.ops) if r0 else 0
    init = max((r.init_seconds or 0.0) for r in reports) if reports else 0.0
    what = f"{f.nproc} {f.backend} rank(s): {n_ops} ops right on every rank ({fmt_bytes(expect.small_bytes)} and {fmt_bytes(expect.large_bytes)}), init {init:.2f} s"
    if f.nccl:
        peers = f.nccl.peers()
        kinds = sorted({t for ts in peers.values() for t in ts})
        what += f"; NCCL {f.nccl.version or (r0.nccl_version if r0 else '?')}, transports {', '.join(kinds) or 'none logged'}"
        if f.nccl.networks:
            what += f", network {'/'.join(f.nccl.networks)}"
    return what + (f"; torch {r0.torch_version}" if r0 and r0.torch_version else "")


class Nccl(Check):
    name = "nccl"
    description = "torchrun on every GPU: collectives give the right answer in time, NCCL uses P2P where it should, no debugging switches left on"
    requires = ("cuda",)
    timeout_seconds = 120.0
    order = 40

    def applies(self, ctx: Context) -> str | None:
        if ctx.profile.nccl is None:
            return f"profile {ctx.profile.name} has no [nccl] table"
        return None

    def run(self, ctx: Context) -> Result:
        expect = ctx.profile.nccl
        assert expect is not None  # applies() said so
        backend = "nccl" if ctx.profile.gpu_count else "gloo"
        nproc = ctx.settings.nproc_per_node or expect.ranks or ctx.profile.gpu_count
        facts = gather(ctx, nproc, expect, backend)
        parts = judge(facts, expect, _linked_pairs(ctx, ("NV",)) or set(), _linked_pairs(ctx, ("PIX", "PXB")))
        details = facts.model_dump(mode="json", exclude={"nccl"})
        details["parts"] = {name: worst(found) for name, found in parts.items()}
        if facts.nccl:
            details["nccl_log"] = {
                "version": facts.nccl.version,
                "networks": facts.nccl.networks,
                "peers": {f"{a}->{b}": t for (a, b), t in sorted(facts.nccl.peers().items())},
                "warnings": [w.message for w in facts.nccl.warnings[:50]],
                "problems": [p.model_dump() for p in facts.nccl.problems],
            }
        findings = [x for found in parts.values() for x in found]
        result = self.conclude(findings, summary(facts, expect), measurements=measurements(facts, expect), details=details)
        result.lines = lines(facts, expect)
        return result


def _gpu_index(gpu: str | None) -> int | None:
    """"GPU 3" -> 3 (nvidia-smi's index); None where the GPU is not known by index."""
    return int(gpu.split()[1]) if gpu and gpu.startswith("GPU ") and gpu.split()[1].isdigit() else None


def _linked_pairs(ctx: Context, kinds: tuple[str, ...]) -> set[frozenset[int]] | None:
    """Pairs of GPUs (nvidia-smi indices) whose `nvidia-smi topo -m` link starts
    with one of ``kinds`` ("NV" for NVLink); None where the topology check did not read a matrix."""
    topo = ctx.results.get("topology")
    matrix = topo.details.get("matrix") if topo else None
    if not matrix or not matrix.get("links"):
        return None
    pairs = set()
    for key, kind in matrix["links"].items():
        a, _, b = key.partition("-")
        if str(kind).startswith(kinds) and a.isdigit() and b.isdigit():
            pairs.add(frozenset((int(a), int(b))))
    return pairs
