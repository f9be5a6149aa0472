"""The time model: the standard level's time to a verdict on 1, 2, 4 and 8 GPUs,
for the nodes no one can run here, projected from per-step costs and the
code's own plan.

Costs come from two places, each cited: what tests/perf/bench_time_model.py
measured on the machine at hand (tests/fixtures/time_model/), and the newest
real GPU run of the code (tests/fixtures/time_model/h200-1x-vm-2026-11-28, call
4: one H200, its standard and quick reports' durations and details, and the
bare torchruns timed beside them). How often each cost is paid comes from the
code: the bandwidth steps from `checks/bandwidth.py` `steps_for`, every size,
repeat, cap and floor from the profile (`preflight.pipeline.profiles`), the
collectives' bus factors from `checks/bandwidth.py` `bus_factor`. No number
the code owns is restated here.

The flow modelled is the run after issue 34's levers, all of which call 4 ran
(NVML's child begun by the CLI first among them): the ranks' launch starts with the run, and the checks that need no
ranks (topology, pcie, rdma, fabric, firmware, shm, judging the plan's one NVML
inventory) run while the ranks import torch; rdma's interval between its
counter reads overlaps that work; cuda's rank stage waits for the ranks then;
firmware takes the torch facts from the ranks; shm writes a small segment; P2P
is measured from local rank 0 over all GPUs (n-1 contexts opened once, then
every ordered pair one at a time); the pinned host buffers are made before the
h2d/d2h turns; the train probe's data parallelism no longer imports
torch._dynamo (`ddp_construct`: 0 s in call 4's report; the 2026-11-27 run paid 3.3 s).

Pure: `costs_from_reports`, `merge`, `project`, `bare` and `table` are
functions of their arguments (tests/test_time_model.py holds the table in
docs/ARCHITECTURE.md to what `table` prints).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from preflight.checks.bandwidth import bus_factor, steps_for
from preflight.checks.bandwidth import p2p_plan as bandwidth_p2p_plan
from preflight.checkkit.train_plan import plan as train_plan
from preflight.pipeline import profiles

GPUS = (1, 2, 4, 8)
GOAL_8_GPUS = 45.0  # issue 34: the standard level on 8 GPUs within 45 s
REPO = Path(__file__).resolve().parents[2]
# The newest real GPU run of the code, as the GPU kit wrote it: call 4's standard and quick
# reports and its bench's verdict (the bare torchruns timed beside them). SOURCE.md says what ran.
RUN = REPO / "tests" / "fixtures" / "time_model" / "h200-1x-vm-2026-11-28"
RUN_FILES = {"standard": "4-standard.json", "quick": "4-quick.json", "verdict": "4-verdict.json"}
MEASURED = REPO / "tests" / "fixtures" / "time_model" / "costs-ci-vm.json"
DOC = REPO / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- time-model:begin -->", "<!-- time-model:end -->"
GIB = 1 << 30
FP32 = 4  # the probe all-reduces fp32 gradients; autocast computes in bf16 but keeps fp32 parameters
# Not in any report of ours: NCCL's own "Init timings" line on 8x H100, NCCL 2.22.3,
# total 2.45-2.46 s on every rank (https://github.com/NVIDIA/nccl/issues/534, 2024-07-22).
NCCL_INIT_8 = 2.46
NCCL_INIT_8_SOURCE = "NCCL's Init timings on 8x H100, NCCL 2.22.3, 2.45-2.46 s a rank (NVIDIA/nccl#534)"


@dataclass(frozen=True)
class Cost:
    seconds: float
    source: str  # where the number came from, in words
    how: str  # "measured" (the machine at hand), "report" (the H200 run), "public"


# ---- the costs the H200 run gives ------------------------------------------------------


def _check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["check"] == name)


def _rank0(check: dict) -> dict:
    return check["details"]["ranks"][0]["report"]


def costs_from_reports(standard: dict, quick: dict, bare_seconds: list[float], ran, where: str = RUN.name) -> dict[str, Cost]:
    """Every cost the real H200 run gives, derived from its two reports' durations and
    details and the bare torchruns timed beside them (SOURCE.md); ``ran``: the profile
    the run used (its warm-up counts and GEMM burst)."""
    std, qk, verdict = (f"{where} {RUN_FILES[k]}" for k in ("standard", "quick", "verdict"))
    cuda = _check(standard, "cuda")["details"]["init"]
    rank = cuda["report"]
    launch = cuda["seconds"] - rank["import_seconds"] - rank["init_seconds"] - rank["seconds"]
    bw_check = _check(standard, "bandwidth")
    bw = _rank0(bw_check)
    res = {r["step"]: r for r in bw["results"]}
    warm = ran.bandwidth.warmup
    step = bw["step_seconds"]
    h2d, d2h = statistics.median(res["h2d"]["seconds"]), statistics.median(res["d2h"]["seconds"])
    turn = step["d2h"] - (warm + len(res["d2h"]["seconds"])) * d2h
    pinned = step["h2d"] - (warm + len(res["h2d"]["seconds"])) * h2d - turn
    nccl_check = _check(standard, "nccl")
    nccl = _rank0(nccl_check)
    tr_check = _check(standard, "train")
    tr = _rank0(tr_check)
    tr_step, tr_comp, tr_gemm = (statistics.median(tr[k]) for k in ("step_seconds", "compute_seconds", "gemm_seconds"))
    longer = lambda name: max(_check(r, name)["duration_seconds"] for r in (standard, quick))  # noqa: E731
    c = {
        # Timed from cuda's rank stage: the launch began ahead of it (the head start), by the plan and the
        # checks beside it, so this is what torchrun's own start left to wait for, not all of it.
        "torchrun_overhead": Cost(launch, f"{std}: cuda details.init.seconds less the rank's import, init and stage seconds (torchrun's start, less the head start's lead)", "report"),
        "torch_import": Cost(rank["import_seconds"], f"{std}: cuda details.init.report.import_seconds", "report"),
        "cuda_init_stage": Cost(rank["init_seconds"] + rank["seconds"], f"{std}: cuda_init's init_seconds + seconds (device probe, PCIe load)", "report"),
        "cuda_context": Cost(max(d["seconds"] for d in rank["devices"]),
                             f"{std}: cuda_init's device probe (a context and a checked matmul): a context costs no more", "report"),
        "topology": Cost(longer("topology"), f"{std}, {qk}: topology, the longer", "report"),
        "firmware": Cost(longer("firmware"), f"{std}, {qk}: firmware, the longer (it judges the plan's NVML inventory and the ranks' torch facts)", "report"),
        "shm_small": Cost(_check(quick, "shm")["duration_seconds"], f"{qk}: shm writing its quick segment", "report"),
        "nccl_init_1": Cost(nccl["init_seconds"], f"{std}: nccl rank 0 init_seconds (1 GPU)", "report"),
        "nccl_init_8": Cost(NCCL_INIT_8, NCCL_INIT_8_SOURCE, "public"),
        "nccl_rest": Cost(nccl_check["duration_seconds"] - nccl["init_seconds"], f"{std}: nccl's duration less its init (the smoke ops, the judging)", "report"),
        "hbm_copy_step": Cost(step["hbm_copy"], f"{std}: bandwidth step_seconds.hbm_copy (every GPU at once)", "report"),
        "h2d_copy": Cost(h2d * GIB / res["h2d"]["bytes"], f"{std}: median h2d repeat, a GiB's share", "report"),
        "d2h_copy": Cost(d2h * GIB / res["d2h"]["bytes"], f"{std}: median d2h repeat, a GiB's share", "report"),
        "turn_overhead": Cost(turn, f"{std}: d2h step less its warm-up and repeats (a turn's barrier, notes, report)", "report"),
        "pinned_alloc": Cost(pinned, f"{std}: h2d step less its copies and a turn's overhead (its pinned buffers)", "report"),
        "bandwidth_rest": Cost(bw_check["duration_seconds"] - bw["seconds"], f"{std}: bandwidth's duration less the worker's seconds (the judging)", "report"),
        "train_step": Cost(tr_step, f"{std}: median train step (1 GPU)", "report"),
        "train_compute": Cost(tr_comp, f"{std}: median compute pass", "report"),
        "train_gemm": Cost(tr_gemm, f"{std}: median GEMM (one matmul)", "report"),
        "train_params": Cost(float(tr["params"]), f"{std}: train params (the probe's model)", "report"),
        "train_observed": Cost(0.0, json.dumps({k: len(tr[k]) for k in ("step_seconds", "compute_seconds", "gemm_seconds")}), "report"),
        "train_rest": Cost(tr_check["duration_seconds"] - tr["seconds"], f"{std}: train's duration less the worker's seconds (the judging)", "report"),
        "run_overhead": Cost(standard["duration_seconds"] - sum(x["duration_seconds"] for x in standard["checks"]),
                             f"{std}: the run's duration less its checks' (the plan with its one NVML inventory, the launch's end, the report)", "report"),
        "bare_torchrun_1": Cost(statistics.median(bare_seconds), f"{verdict}: a bare torchrun, {', '.join(f'{s:g}' for s in bare_seconds)} s", "report"),
        # The run's probe built torch's DistributedDataParallel, whose constructor imports torch._dynamo
        # (with triton and sympy); the probe's own data parallelism since does not (checks/workers/_dataparallel.py).
        "ddp_construct": Cost(tr["phases"].get("ddp", 0.0), f"{std}: train rank 0's `ddp` phase (DDP's construction, torch._dynamo's import), which the probe no longer pays", "report"),
    }
    # What a 1-GPU run spends in the fixed parts of the probe: the worker's seconds less the timed phases,
    # the GEMM warm-up as project() counts it (the profile's seconds; the last burst past them stays here).
    obs = json.loads(c["train_observed"].source)
    timed = ((ran.train.warmup_steps + obs["step_seconds"]) * tr_step + (1 + obs["compute_seconds"]) * tr_comp
             + ran.train.gemm_warmup_seconds + obs["gemm_seconds"] * ran.train.gemm_burst * tr_gemm)
    c["train_fixed"] = Cost(tr["seconds"] - timed - c["ddp_construct"].seconds,
                            f"{std}: train worker seconds less its timed phases and `ddp_construct` (model build, first passes, checksums)", "report")
    return c


def reports_costs(run: Path = RUN) -> dict[str, Cost]:
    """``costs_from_reports`` of the recorded H200 run (SOURCE.md beside it)."""
    load = lambda key: json.loads((run / RUN_FILES[key]).read_text())  # noqa: E731
    ran = profiles.load(profiles.find("h200-sxm", None))
    return costs_from_reports(load("standard"), load("quick"), load("verdict")["seconds"]["bare torchrun"], ran)


def merge(report: dict[str, Cost], measured: dict[str, Cost], gpu: bool) -> dict[str, Cost]:
    """The costs the model uses. Measured on a GPU node, a cost replaces the report's;
    measured on CPU (no CUDA in that torch, another machine's disk and cores), the
    larger of the two is kept: a projection errs long, never short."""
    out = dict(report)
    for name, m in measured.items():
        r = report.get(name)
        out[name] = m if gpu or r is None or m.seconds >= r.seconds else r
    return out


def load_measured(path: Path = MEASURED) -> tuple[dict[str, Cost], bool]:
    doc = json.loads(path.read_text())
    return {k: Cost(**v) for k, v in doc["costs"].items()}, bool(doc["gpu"])


def dump_measured(costs: dict[str, Cost], gpu: bool, machine: str) -> str:
    return json.dumps({"machine": machine, "gpu": gpu, "costs": {k: asdict(v) for k, v in sorted(costs.items())}}, indent=1) + "\n"


# ---- the code's plan ---------------------------------------------------------------------


def p2p_plan(n: int) -> tuple[int, int]:
    """(contexts opened, ordered pairs copied) by the P2P step from local rank 0: the worker's own plan."""
    plan = bandwidth_p2p_plan(n)
    return plan.contexts, plan.timed


def train_counts(expect, observed: dict[str, int]) -> dict[str, int]:
    """How many steps, compute passes and GEMM bursts the probe times (checkkit/train_plan.py's plan):
    its least counts, or as many as the H200 run needed to converge, within the caps."""
    p = train_plan(expect)
    return {"steps": min(p.max_steps, max(p.steps, observed["step_seconds"])),
            "compute": min(p.max_compute_steps, max(p.compute_steps, observed["compute_seconds"])),
            "gemm": min(p.max_gemm_repeats, max(p.gemm_repeats, observed["gemm_seconds"]))}


def _floor(profile, name: str) -> float:
    return profile.floors[name].value


def _repeated(one: float, least: int, count: int, max_seconds: float) -> float:
    """``count`` repeats of ``one`` s: the least always run; the rest stop at max_seconds (the last may start just before)."""
    t = least * one
    return t + min((count - least) * one, max(0.0, max_seconds - t) + one)


def nccl_init(n: int, c: dict[str, Cost]) -> float:
    """NCCL's init on n GPUs: the 1-GPU figure and the 8-GPU one, linear between."""
    a, b = c["nccl_init_1"].seconds, c["nccl_init_8"].seconds
    return a + (b - a) * (n - 1) / 7


def project(n: int, c: dict[str, Cost], profile) -> list[tuple[str, float]]:
    """The standard level on n GPUs, term by term, in seconds: (name, seconds).
    Terms whose name starts with "  " run inside the row above them, which holds their sum or maximum."""
    bw, tr, rd = profile.bandwidth, profile.train, profile.rdma
    launch = c["torchrun_overhead"].seconds + c["torch_import"].seconds + c["cuda_init_stage"].seconds
    # The quick level's checks are those that need no ranks; past cuda, which judges the plan's
    # NVML inventory (read before the ranks start, inside run_overhead), firmware and shm, each
    # reads a tool's output or sysfs: counted as topology's time.
    readers = [name for name in profile.levels.quick.checks if name not in ("cuda", "firmware", "shm")]
    agent = len(readers) * c["topology"].seconds + c["firmware"].seconds + c["shm_small"].seconds
    interval = rd.interval_seconds if rd else 0.0
    rows = [("agent start (python, preflight, before the plan)", c["agent_start"].seconds),
            ("first phase: the longest of", max(launch, agent, interval)),
            ("  the ranks' launch: torchrun, torch import, cuda_init", launch),
            ("  checks without ranks: topology, pcie, rdma, fabric, firmware, shm (the plan's NVML reading shared)", agent),
            ("  rdma's interval between counter reads", interval),
            ("nccl: init and the smoke ops", nccl_init(n, c) + c["nccl_rest"].seconds)]
    count = bw.warmup + bw.repeats  # every figure converged at its least repeats on the H200
    turn = c["turn_overhead"].seconds
    parts: list[tuple[str, float]] = []
    for s in steps_for(True, n, bw):
        if s == "hbm_copy":
            parts.append(("  hbm_copy (every GPU at once)", c["hbm_copy_step"].seconds))
        elif s in ("h2d", "d2h"):
            one = c[f"{s}_copy"].seconds * bw.host_bytes / GIB
            pinned = c["pinned_alloc"].seconds if s == "h2d" else 0.0
            parts.append((f"  {s}: {'pinned buffers, then ' if pinned else ''}one turn a GPU", pinned + n * (_repeated(one, count, count, bw.max_seconds) + turn)))
        elif s == "p2p":
            contexts, pairs = p2p_plan(n)
            one = bw.p2p_bytes / _floor(profile, "p2p_bandwidth")
            parts.append(("  p2p: contexts from rank 0", contexts * c["cuda_context"].seconds))
            parts.append(("  p2p: every ordered pair at the floor", pairs * (_repeated(one, count, count, bw.max_seconds) + turn)))
        elif s in ("all_reduce", "all_gather", "reduce_scatter"):
            one = bw.collective_bytes * bus_factor(s, n) / _floor(profile, "allreduce_bus_bandwidth_ring")
            parts.append((f"  {s} at the ring floor", _repeated(one, count, count, bw.max_seconds) + turn))
        elif s in ("latency", "graph_latency"):
            parts.append((f"  {s} at the ceiling", bw.latency_iters * _floor(profile, "allreduce_latency") + turn))
        else:  # a step the model does not know would leave its time out of the projection
            raise ValueError(f"the time model has no cost for the bandwidth step {s!r}: add one")
    rows.append(("bandwidth", sum(t for _, t in parts) + c["bandwidth_rest"].seconds))
    rows += parts
    k = train_counts(tr, json.loads(c["train_observed"].source))
    grad = c["train_params"].seconds * FP32 * bus_factor("all_reduce", n) / _floor(profile, "allreduce_bus_bandwidth_ring") if n > 1 else 0.0
    tparts = [("  train: model build, first passes, checksums", c["train_fixed"].seconds),
              ("  train: steps, gradients all-reduced at the ring floor",
               tr.warmup_steps * (c["train_step"].seconds + grad) + _repeated(c["train_step"].seconds + grad, tr.steps, k["steps"], tr.max_seconds)),
              ("  train: compute passes", c["train_compute"].seconds + _repeated(c["train_compute"].seconds, tr.compute_steps, k["compute"], tr.max_seconds)),
              ("  train: GEMM warm-up and bursts", tr.gemm_warmup_seconds + _repeated(tr.gemm_burst * c["train_gemm"].seconds, tr.gemm_repeats, k["gemm"], tr.max_seconds))]
    rows.append(("train", sum(t for _, t in tparts) + c["train_rest"].seconds))
    rows += tparts
    rows.append(("the plan's NVML inventory, the launch's end, the report", c["run_overhead"].seconds))
    return rows


_COLL = ["turn_overhead", "profile: allreduce_bus_bandwidth_ring, collective_bytes, warmup, repeats", "code: bus_factor"]
_LAT = ["turn_overhead", "profile: allreduce_latency (ceiling), latency_iters"]
# What each row is made of: a cost (measured, report or public) or the plan it takes from the code.
USES = {
    "agent start (python, preflight, before the plan)": ["agent_start"],
    "first phase: the longest of": ["the three rows below, side by side"],
    "  the ranks' launch: torchrun, torch import, cuda_init": ["torchrun_overhead", "torch_import", "cuda_init_stage"],
    "  checks without ranks: topology, pcie, rdma, fabric, firmware, shm (the plan's NVML reading shared)": ["topology", "firmware", "shm_small", "profile: [levels.quick]"],
    "  rdma's interval between counter reads": ["profile: [rdma] interval_seconds"],
    "nccl: init and the smoke ops": ["nccl_init_1", "nccl_init_8", "nccl_rest"],
    "bandwidth": ["the rows below", "bandwidth_rest", "code: steps_for"],
    "  hbm_copy (every GPU at once)": ["hbm_copy_step"],
    "  h2d: pinned buffers, then one turn a GPU": ["pinned_alloc", "h2d_copy", "turn_overhead", "profile: host_bytes, warmup, repeats"],
    "  d2h: one turn a GPU": ["d2h_copy", "turn_overhead", "profile: host_bytes, warmup, repeats"],
    "  p2p: contexts from rank 0": ["cuda_context", "code: p2p_plan"],
    "  p2p: every ordered pair at the floor": ["turn_overhead", "profile: p2p_bandwidth, p2p_bytes, warmup, repeats", "code: p2p_plan"],
    **{f"  {s} at the ring floor": _COLL for s in ("all_reduce", "all_gather", "reduce_scatter")},
    **{f"  {s} at the ceiling": _LAT for s in ("latency", "graph_latency")},
    "train": ["the rows below", "train_rest"],
    "  train: model build, first passes, checksums": ["train_fixed"],
    "  train: steps, gradients all-reduced at the ring floor": ["train_step", "train_params", "profile: allreduce_bus_bandwidth_ring, warmup_steps, steps", "code: train_counts"],
    "  train: compute passes": ["train_compute", "profile: compute_steps", "code: train_counts"],
    "  train: GEMM warm-up and bursts": ["train_gemm", "profile: gemm_warmup_seconds, gemm_burst, gemm_repeats", "code: train_counts"],
    "the plan's NVML inventory, the launch's end, the report": ["run_overhead"],
    "a bare torchrun": ["torchrun_overhead", "torch_import", "cuda_context", "nccl_init_1", "nccl_init_8", "bare_torchrun_1"],
}


def _made_of(name: str, c: dict[str, Cost]) -> str:
    return ", ".join(f"`{u}` ({c[u].how})" if u in c else u for u in USES[name])


def total(rows: list[tuple[str, float]]) -> float:
    return sum(t for name, t in rows if not name.startswith("  "))


def bare(n: int, c: dict[str, Cost], report: dict[str, Cost]) -> float:
    """A bare torchrun on n GPUs (torch import, an NCCL group, one all_reduce, exit): the
    launch, NCCL's init, and the rest the H200's bare run took past those (its exit, and
    the head start's lead, which the run's launch figure leaves out)."""
    rest = report["bare_torchrun_1"].seconds - sum(report[k].seconds for k in ("torchrun_overhead", "torch_import", "cuda_context", "nccl_init_1"))
    return c["torchrun_overhead"].seconds + c["torch_import"].seconds + c["cuda_context"].seconds + nccl_init(n, c) + rest


def table(c: dict[str, Cost], report: dict[str, Cost], profile) -> str:
    """The model's table, as docs/ARCHITECTURE.md holds it (markdown)."""
    runs = {n: project(n, c, profile) for n in GPUS}
    lines = ["| term (seconds) | " + " | ".join(f"{n} GPU{'s' if n > 1 else ''}" for n in GPUS) + " | made of |",
             "|---|" + "---:|" * len(GPUS) + "---|"]
    by_name = {n: dict(runs[n]) for n in GPUS}
    for name, _ in runs[max(GPUS)]:  # the most GPUs run every step; fewer leave some out (-)
        shown = name.strip() if not name.startswith("  ") else "&nbsp;&nbsp;" + name.strip()
        cells = (f"{by_name[n][name]:.2f}" if name in by_name[n] else "-" for n in GPUS)
        lines.append(f"| {shown} | " + " | ".join(cells) + f" | {_made_of(name, c)} |")
    tot = {n: total(runs[n]) for n in GPUS}
    b = {n: bare(n, c, report) for n in GPUS}
    lines.append("| **total** | " + " | ".join(f"**{tot[n]:.1f}**" for n in GPUS) + " | the rows not indented |")
    lines.append("| a bare torchrun | " + " | ".join(f"{b[n]:.1f}" for n in GPUS) + f" | {_made_of('a bare torchrun', c)} |")
    lines.append("| ratio | " + " | ".join(f"{tot[n] / b[n]:.2f}x" for n in GPUS) + " | total over a bare torchrun |")
    # The launch rows above keep this machine's slower torchrun and torch import (merge): longer on
    # both sides of the ratio, which reads lower for it. The GPU run's own costs, where it gave one:
    own = {**c, **report}
    ratio = (total(project(n, own, profile)) / bare(n, own, report) for n in GPUS)
    lines.append("| ratio on the GPU run's own costs | " + " | ".join(f"{x:.2f}x" for x in ratio) + " | the same, each cost the report gives taken from it |")
    return "\n".join(lines)


def sources(c: dict[str, Cost]) -> str:
    """Each cost, its value and where it came from (markdown list)."""
    return "\n".join(f"- `{k}` {v.seconds:.4g} s, {v.how}: {v.source}" for k, v in sorted(c.items()) if k != "train_observed" and k != "train_params") + \
        f"\n- `train_params` {c['train_params'].seconds:.0f}, {c['train_params'].how}: {c['train_params'].source}" + \
        f"\n- `train_observed` {c['train_observed'].source}: the H200 run's timed steps, compute passes and GEMM bursts (report)"


def model(profile_name: str = "h200-sxm", measured: Path = MEASURED) -> tuple[dict[str, Cost], dict[str, Cost], object]:
    """The committed model: the recorded measurements merged with the H200 run's costs, and the profile."""
    report = reports_costs()
    m, gpu = load_measured(measured)
    return merge(report, m, gpu), report, profiles.load(profiles.find(profile_name, None))


def doc_block(c: dict[str, Cost], report: dict[str, Cost], profile) -> str:
    return f"{BEGIN}\n{table(c, report, profile)}\n\nThe costs (`tests/perf/time_model.py`):\n\n{sources(c)}\n{END}"


def main(argv: list[str]) -> int:
    """Print the committed model's table; with --write, put it into docs/ARCHITECTURE.md
    (after a plan or a recorded cost changed: tests/test_time_model.py then holds it)."""
    c, report, profile = model()
    block = doc_block(c, report, profile)
    if "--write" in argv:
        text = DOC.read_text()
        DOC.write_text(text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):])
    print(block)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
