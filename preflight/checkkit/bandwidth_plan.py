"""The bandwidth check's plan: which steps the worker runs on a node, which it
runs again to confirm a figure, what each copy step pays on n GPUs (for the
time model, tests/perf/time_model.py), and where a run's time went and what
its P2P step left behind, from the ranks' own reports.
"""

from __future__ import annotations

from typing import NamedTuple

from preflight.checkkit.bandwidth_figures import COLLECTIVE, PER_DEVICE, BandwidthFacts, RankReport, Setup, who
from preflight.pipeline.load_expectations import BandwidthExpect


class CopyPlan(NamedTuple):
    """How one copy step is laid out on n GPUs, as the worker runs it: what a time model
    multiplies its measured costs by (each field's cost in the comment)."""

    timed: int  # figures timed one after the other (each: warm-up + repeats of one copy, the convergence rule's)
    contexts: int  # CUDA contexts opened before any timing, one after the other (~0.13 s each on an H100)
    allocations: int  # rounds of buffer making in series (every rank at once is one round): cudaMalloc, cudaHostAlloc, the fill
    barriers: int  # gloo barriers between turns (a turn's deadline each)
    foreign_contexts: int  # GPUs left holding one context of another rank's process, until the launch ends


def p2p_plan(n: int) -> CopyPlan:
    """The p2p step on n GPUs: local rank 0 opens a context on each other GPU and makes every
    buffer (once), then times each ordered pair alone, the other ranks at a barrier per pair
    (checks/workers/_bw_copies.py pairs() lists them; a test holds the two alike)."""
    if n < 2:
        return CopyPlan(0, 0, 0, 0, 0)
    return CopyPlan(timed=n * (n - 1), contexts=n - 1, allocations=1, barriers=n * (n - 1) + 2, foreign_contexts=n - 1)


def host_copy_plan(n: int) -> CopyPlan:
    """h2d or d2h on n GPUs: every rank pins and fills its host buffers at once (one round),
    then each times its copies in its own turn while the others wait at a barrier."""
    return CopyPlan(timed=n, contexts=0, allocations=1, barriers=n + 1, foreign_contexts=0)


def steps_for(gpu: bool, nproc: int, expect: BandwidthExpect, nnodes: int = 1, one_process: str | None = None) -> list[str]:
    """``one_process``: why a GPU admits one process only (exclusive_gpus), which leaves p2p out."""
    steps = ["hbm_copy", "h2d", "d2h"] if gpu else ["memcpy"]
    if gpu and nproc > 1 and one_process is None:
        steps.append("p2p")
    if nproc * nnodes > 1:  # one rank has no peer to reduce with: nccl-tests prints busbw 0
        steps += ["all_reduce", "all_gather", "reduce_scatter", "latency"]
        if gpu and expect.graph:
            steps.append("graph_latency")
    return steps


# A figure's name -> the worker's step that measures it: only those steps run again to confirm.
STEP_OF = {**{v: k for k, v in PER_DEVICE.items()}, **{v: k for k, v in COLLECTIVE.items()}, "allreduce_latency": "latency", "allreduce_latency_p99": "latency"}


def steps_again(missed: list[str], steps: list[str]) -> list[str]:
    """The steps that measured the figures ``missed``, in the first run's order."""
    want = {STEP_OF.get(name) for name in missed}
    return [s for s in steps if s in want]


def seconds_skipped(f: BandwidthFacts, redo: list[str]) -> float:
    """Of the first launch's time, what its other steps took (the slowest rank's): a second launch of ``redo`` saves it."""
    slowest: dict[str, float] = {}
    for o in f.ranks:
        for step, sec in (o.report.step_seconds if isinstance(o.report, RankReport) else {}).items():
            slowest[step] = max(sec, slowest.get(step, 0.0))
    return sum(sec for step, sec in slowest.items() if step not in redo)


def exclusive_gpus(modes: dict[int, str | None]) -> str | None:
    """Why the p2p step cannot run, in words, where a GPU admits one process: its copies
    are made from local rank 0's process on every GPU, which needs a second context on
    each GPU but rank 0's (a job's NCCL reaches its peers through CUDA IPC inside its own
    context, and runs)."""
    held = sorted(i for i, mode in modes.items() if mode in ("exclusive_process", "exclusive_thread"))
    if not held:
        return None
    which = "every GPU is" if len(held) == len(modes) else f"GPU {', '.join(map(str, held))} {'is' if len(held) == 1 else 'are'}"
    return (f"GPU->GPU copies not measured: {which} in compute mode EXCLUSIVE_PROCESS (NVML), one process per GPU, and the copies, "
            "made from local rank 0's process over every GPU, would need a second context on each GPU but its own; the collectives, through NCCL, are measured")


# ---- what a run spent and left behind, from the ranks' reports ----------------------


def time_line(f: BandwidthFacts) -> list[str]:
    """Where the check's time went, by step (the slowest rank's), so a profile can be tuned to its budget."""
    slowest: dict[str, float] = {}
    for o in f.ranks:
        for step, sec in (o.report.step_seconds if isinstance(o.report, RankReport) else {}).items():
            slowest[step] = max(sec, slowest.get(step, 0.0))
    if not slowest:
        return []
    init = max((o.report.import_seconds or 0) + (o.report.init_seconds or 0) for o in f.ranks if o.report)
    made = p2p_setup(f)

    def spent(step: str, sec: float) -> str:
        if step == "p2p" and made:
            return f"p2p {sec:.1f} s ({made.contexts} contexts {made.contexts_seconds:.1f} s, buffers {made.buffers_seconds:.1f} s)"
        return f"{step} {sec:.1f} s"

    return ["time: import + init " + f"{init:.1f} s, " + ", ".join(spent(step, sec) for step, sec in slowest.items()) + (f"; torchrun {f.seconds:.1f} s" if f.seconds else "")]


def p2p_setup(f: BandwidthFacts) -> Setup | None:
    """What local rank 0 made before timing the GPU->GPU copies (its contexts on the other GPUs, the buffers), as it reported it."""
    return next((o.report.setup["p2p"] for o in f.ranks if isinstance(o.report, RankReport) and "p2p" in o.report.setup), None)


def foreign_contexts(f: BandwidthFacts) -> dict | None:
    """The GPUs on which the P2P step left a context of another rank's process: local rank 0's,
    one on each other GPU, for as long as the launch lives (memtest then finds that much less free)."""
    made = p2p_setup(f)
    if not made or not made.contexts:
        return None
    gpu = {o.rank: o.gpu for o in f.ranks}
    return {"process": made.by, "gpus": [who(r, gpu) for r in range(1, made.gpus)], "per_gpu": 1}


def foreign_line(f: BandwidthFacts) -> list[str]:
    held = foreign_contexts(f)
    if held is None:
        return []
    return [f"GPU->GPU copies made from {held['process']}'s process over every GPU: {', '.join(held['gpus'])} each hold that one context of it for the rest of the launch"]
