"""The driver, every GPU's health as NVML reports it, Xid errors since boot,
and CUDA init on every GPU.

The first check of every GPU profile, because it catches the nodes that burn
money before anything else runs: a driver that lost a GPU, `CUDA unknown
error` at init, pending row remaps, a PCIe link trained at x8, a GPU held
back by hardware slowdown, a fatal Xid since boot.

How the PCIe link is judged: idle GPUs drop their link to Gen1 to save power,
so an idle reading proves nothing about the generation. The cuda_init worker
copies to every GPU after its matmuls until told to stop, and NVML reads the
links meanwhile; only that loaded reading is judged for generation. A narrow
width is judged from either reading, since links do not narrow to save power.

Those NVML judges live in checkkit/gpu_health.py, shared with `preflight
explain` of a saved `nvidia-smi -q`, and the Xid judge in checkkit/cuda_xid.py;
here is the CUDA-init judge.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections import Counter

from pydantic import BaseModel

from preflight.checkkit.cuda_xid import elsewhere_xids, job_xids, judge_xid
from preflight.checkkit.gpu_health import DRAIN, RESET, judge_inventory, node_nvlinks, prohibited, recovery_actions, who
from preflight.checkkit.sources import Sources, one_fact
from preflight.gpuwork import interpreter, launch
from preflight.gpuwork.cuda_init import InitOutcome, InitReport, loaded_links, run_init
from preflight.readers.nvidia import nvml, nvml_facts
from preflight.readers.kernel import log_sources, xid
from preflight.pipeline.check import Check, Context, Result, Waiting
from preflight.base.findings import Finding, Measurement, Status, worst
from preflight.readers.nvidia.nvml_facts import Inventory, PcieLink
from preflight.pipeline.expectations import GpuExpect
from preflight.pipeline.shape import NodeShape
from preflight.readers.nvidia.visible_devices import cuda_visible

MARGIN = 5.0  # seconds kept from the check's deadline to judge and report a hung worker

TORCH = "point --python at the training environment's interpreter, or install a CUDA build of torch there"
FAIL, WARN = Status.FAIL, Status.WARN
QUICK = "the quick level starts no CUDA work (standard and full do)"


class CudaFacts(BaseModel):
    inventory: Inventory
    xid_events: list[xid.XidEvent] = []
    kernel_log: str  # where the Xid scan read, or "unavailable: why"
    kernel_log_unread: dict[str, str] = {}  # each source of the kernel log that could not be read, and why
    kernel_log_note: str | None = None  # what the Xid scan could not see (a wrapped ring, no journal), or how it pieced the log
    init: InitOutcome | None = None  # None: not attempted
    init_skipped: str | None = None
    pcie_loaded: dict[str, PcieLink] | None = None  # bus id -> link while the worker copied
    pcie_unjudged: str | None = None  # why the PCIe generation was not judged under load


# ---- gathering -------------------------------------------------------------


def gather(ctx: Context) -> CudaFacts:
    """Raises NvmlUnavailable when NVML cannot answer at all."""
    fake = ctx.settings.nvml_fake
    ctx.progress.stage("asking NVML")  # a wedged driver stalls here until the query's deadline
    inventory = ctx.inventory(timeout=min(20.0, _left(ctx)))
    ctx.progress.stage("reading the kernel log")
    try:
        log = log_sources.read_log(ctx.host, timeout=min(10.0, _left(ctx)))
        events, kernel_log, unread, note = xid.parse(log.text), log.source, log.unread, log.note
    except log_sources.KernelLogUnavailable as e:
        events, kernel_log, unread, note = [], f"unavailable: {e}", e.unread, None
    facts = CudaFacts(inventory=inventory, xid_events=events, kernel_log=kernel_log, kernel_log_unread=unread, kernel_log_note=note)
    if ctx.settings.level == "quick":  # no torch, no GPU work: a prolog's seconds, a busy node's recheck
        facts.init_skipped = QUICK
        return facts
    if inventory.lost or not inventory.gpus:
        # A lost GPU can hang CUDA init for the whole deadline; NVML already named the fault.
        facts.init_skipped = "NVML reports lost GPUs" if inventory.lost else "NVML reports no GPU"
        return facts
    if fenced := prohibited(inventory):
        # CUDA init could only fail there, with the driver's "busy or unavailable"; NVML already said why.
        facts.init_skipped = f"NVML reports compute mode PROHIBITED on {', '.join(who(g) for g in fenced)}"
        return facts
    return facts  # init_skipped None: CUDA init is wanted (``probe``)


def probe(ctx: Context, facts: CudaFacts) -> CudaFacts:
    """CUDA init on every GPU (the run's shared launch, its first stage), the links read under its load."""
    python = str(ctx.settings.python) if ctx.settings.python else sys.executable
    facts.init, loaded = run_init(python, _left(ctx) - MARGIN, read_links=ctx.settings.nvml_fake is None, progress=ctx.progress,
                                  worlds=ctx.worlds, nproc=launch_ranks(ctx), rdzv_port=ctx.settings.rdzv_port)
    facts.pcie_loaded, facts.pcie_unjudged = loaded_links(facts.init, loaded, facts.inventory)
    return facts


def kernel_log_sources(where: str, unread: dict[str, str]) -> Sources:
    """Which source gave the kernel log (``where``, else why none did) and which could not, for details and the metric."""
    return one_fact("kernel log", None if where.startswith("unavailable") else where, unread)


def xid_unjudged(facts: CudaFacts) -> str | None:
    """Why Xid errors since boot went unjudged (no kernel log source could be read here), or None."""
    if not facts.kernel_log.startswith("unavailable"):
        return None
    return (f"not judged: the kernel log could not be read ({facts.kernel_log}); give preflight CAP_SYSLOG "
            "(or kernel.dmesg_restrict=0), or check `preflight xid` by hand")


def launch_ranks(ctx: Context) -> int:
    """The ranks of the launch cuda_init starts: the one the nccl, bandwidth and train checks will share."""
    return ctx.ranks(ctx.profile.nccl.ranks if ctx.profile.nccl else None)


def _left(ctx: Context) -> float:
    return max(1.0, min(ctx.deadline - time.monotonic(), 3600.0))


# ---- judging ---------------------------------------------------------------


_INIT_CAUSES = [
    # The driver's own words -> what has fixed it on real nodes.
    ("system not yet initialized", "the NVSwitch fabric is not up: nvidia-fabricmanager is not running or failed",
     "`systemctl enable --now nvidia-fabricmanager` (its version must equal the driver's), then retry"),
    ("unknown error", "CUDA could not initialise a GPU (`CUDA unknown error`)",
     "check CUDA_VISIBLE_DEVICES; compare `cat /proc/driver/nvidia/version` with `nvidia-smi` (a kernel module/driver "
     "mismatch after an upgrade needs a reboot); reset the GPUs (`nvidia-smi -r`) or reboot; if it persists, " + DRAIN),
    # cudaErrorSystemDriverMismatch (803): the libcuda the job loads is not the loaded module's own.
    ("unsupported display driver / cuda driver combination",
     "the CUDA driver library does not match the loaded kernel module: libcuda from another driver (an upgrade without "
     "a reboot, a container that brings its own), or cuda-compat on a driver branch it does not support",
     "compare `cat /proc/driver/nvidia/version` with the libcuda.so the job loads (`ldconfig -p | grep libcuda`, "
     "LD_LIBRARY_PATH); reboot after a driver upgrade, or remove cuda-compat from LD_LIBRARY_PATH"),
    ("no cuda-capable device", "CUDA finds no usable GPU",
     "check CUDA_VISIBLE_DEVICES and the permissions on /dev/nvidia*; in a container, pass the GPUs (--gpus all / the NVIDIA runtime)"),
    ("driver version is insufficient", "the driver is older than the CUDA runtime torch was built with",
     "install a newer driver, or a torch built for an older CUDA"),
    ("forward compatibility", "the CUDA forward-compatibility libraries do not work with this GPU or driver",
     "remove cuda-compat from LD_LIBRARY_PATH, or install a newer driver"),
]


def _gpu_of(cuda_index: int, r: InitReport, inv: Inventory) -> tuple[str, str]:
    """(who, index for nvidia-smi -i) of a CUDA device: by PCI address, since
    CUDA_VISIBLE_DEVICES can renumber; by index only where nothing can."""
    bus = r.pci_bus_ids[cuda_index] if cuda_index < len(r.pci_bus_ids) else None
    by_bus = {nvml_facts.short_pci(g.pci_bus_id): g for g in inv.gpus}
    g = by_bus.get(nvml_facts.short_pci(bus)) if bus else None
    if g is None and bus is None and r.cuda_visible_devices is None:
        g = next((x for x in inv.gpus if x.index == cuda_index), None)
    if g is not None:
        return who(g), str(g.index)
    return f"CUDA device {cuda_index}" + (f" ({nvml_facts.short_pci(bus)})" if bus else ""), "N"


def judge_init(init: InitOutcome | None, inv: Inventory) -> list[Finding]:
    if init is None:
        return []
    python, r = init.python, init.report
    by_hand = f"run it by hand to see why: {python} {launch.WORKERS_DIR / 'cuda_init.py'}"
    if r is None:
        why = f" and {init.unreadable}" if init.unreadable else ""
        missing = next((line.strip() for line in init.log_tail if re.search(r"No module named '?torch\b", line)), None)
        if missing:  # torchrun itself is torch's: the shared launch never started
            return [Finding(FAIL, "torch is not importable", f"torch not importable by {python}: {missing}", TORCH)]
        if init.timed_out:
            return [Finding(FAIL, "CUDA init hung", f"the cuda_init worker under {python} hung before reporting ({init.ended}); last output: {init.last_output()}", by_hand)]
        cause = f"the cuda_init worker under {python} {init.ended}{why}; last output: {init.last_output()}"
        return [interpreter.judge(python, init.interpreter, cause) or Finding(FAIL, "the CUDA init worker failed", cause, by_hand)]
    # A report of one process (a recorded one) names its device in ``current`` alone.
    unfinished = r.unfinished or ([r.current] if r.current is not None else [])
    if unfinished and (init.timed_out or init.returncode != 0):
        gpus = [_gpu_of(c, r, inv) for c in unfinished]
        whos, i = " and ".join(w for w, _ in gpus), gpus[0][1] if len(gpus) == 1 else "N"
        how = "hung" if init.timed_out else "died"
        their = "its CUDA probe" if len(gpus) == 1 else "their CUDA probes (each rank probes its own GPU at once: none is known to be the one at fault)"
        cause = f"{whos} did not finish {their}: the worker {init.ended}; last output: {init.last_output()}"
        reset = RESET.format(i=i) + ("" if len(gpus) == 1 else f" (N: {', '.join(x for _, x in gpus)})")
        return [Finding(FAIL, f"CUDA init {how} on {whos}", cause, reset + "; if it happens again, " + DRAIN)]
    if init.timed_out:
        stage = {"import": f"importing torch with {python}", "init": "torch.cuda.init()", "load": "copying to the GPUs"}.get(r.stage, r.stage)
        return [Finding(FAIL, "CUDA init hung", f"the cuda_init worker hung in {stage} ({init.ended}); last output: {init.last_output()}", RESET.format(i="N") + "; " + DRAIN)]
    if r.error_kind == "no_torch":
        return [Finding(FAIL, "torch is not importable", f"torch not importable by {python}: {r.error}", TORCH)]
    if r.error_kind == "cpu_build":
        return [Finding(FAIL, "no CUDA device: torch is a CPU-only build", f"no CUDA device: {r.error}, under {python}", TORCH)]
    if r.error_kind in ("init", "no_device"):
        error = r.error or ""
        for words, cause, remedy in _INIT_CAUSES:
            if words in error.lower():
                return [Finding(FAIL, f"CUDA init failed: {cause.split(':')[0]}", f"{cause}: {error}", remedy)]
        return [Finding(FAIL, "CUDA init failed", f"torch.cuda.init() failed: {error}", RESET.format(i="N") + "; " + DRAIN)]
    out = []
    if r.device_count is not None and r.cuda_visible_devices is None and r.device_count != len(inv.gpus):
        cause = f"torch.cuda.device_count() is {r.device_count} but NVML lists {len(inv.gpus)} GPUs"
        out.append(Finding(FAIL, f"CUDA sees {r.device_count} GPUs, NVML {len(inv.gpus)}", cause, "unset CUDA_VISIBLE_DEVICES for preflight; otherwise " + DRAIN))
    elif r.device_count is not None and r.cuda_visible_devices is not None:
        # A scheduler's CUDA_VISIBLE_DEVICES (a Slurm step given GPUs 4-7) hides the rest from CUDA, and the
        # launch sized to what it names (shape.py): CUDA is held to that, read as CUDA reads it.
        vis = cuda_visible(r.cuda_visible_devices, [g.uuid for g in sorted(inv.gpus, key=lambda g: nvml_facts.short_pci(g.pci_bus_id))])
        if r.device_count != vis.count:
            stop = f"; {vis.stop}" if vis.stop else ""
            cause = (f"torch.cuda.device_count() is {r.device_count} but CUDA_VISIBLE_DEVICES={r.cuda_visible_devices} names "
                     f"{vis.count} of the {len(inv.gpus)} GPUs NVML lists{stop}")
            out.append(Finding(FAIL, f"CUDA sees {r.device_count} GPUs, CUDA_VISIBLE_DEVICES names {vis.count}", cause,
                               "check that CUDA_VISIBLE_DEVICES names the GPUs this job was given; otherwise " + DRAIN))
    for d in r.devices:
        who, i = _gpu_of(d.index, r, inv)
        if d.error:
            out.append(Finding(FAIL, f"{who}: CUDA failed", f"{who}: {d.error}", RESET.format(i=i) + "; " + DRAIN))
        elif d.error_ratio is not None and not d.error_ratio <= 1.0:  # NaN is wrong too
            cause = f"{who}'s fp32 matmul is off by {d.error_ratio:.3g} x the rounding bound against a float64 CPU reference: silent data corruption suspect"
            out.append(Finding(FAIL, f"{who} computes wrong results", cause, DRAIN))
    if not out and (r.stage != "done" or init.returncode != 0):
        cause = f"the worker reached stage {r.stage!r} and {init.ended}; last output: {init.last_output()}"
        out.append(Finding(FAIL, "the CUDA init worker failed", cause, by_hand))
    return out


def judge(facts: CudaFacts, shape: NodeShape | None, expect: GpuExpect | None, driver_pin: str | None) -> dict[str, list[Finding]]:
    """Findings by part, so a report says which part failed."""
    inv = facts.inventory
    # A kernel log this process may not read (a container without CAP_SYSLOG, dmesg_restrict) is
    # the reader's trouble, not the node's: the part is not judged (xid_unjudged), and says why.
    # The kernel log is the host's: a GPU given to another pod or job is judged by the run that holds it.
    xids = judge_xid(facts.xid_events, inv, forgeable=facts.kernel_log_note == log_sources.SYSLOG_NOTE,
                     not_given=shape.not_given() if shape else None)
    parts = {
        "inventory": judge_inventory(inv, shape, expect, driver_pin, facts.pcie_loaded),
        "xid": xids,
        "cuda_init": judge_init(facts.init, inv),
    }
    if inv.source != "NVML":  # fail closed: a run on invented facts has not vouched for this node
        parts["source"] = [nvml.fake_finding(inv.source.removeprefix("fake "))]
    return parts


def measurements(facts: CudaFacts, expect: GpuExpect | None = None, shape: NodeShape | None = None) -> list[Measurement]:
    """Per GPU, with dcgm-exporter's labels; where the check holds a figure to a
    bound, the bound rides along as its floor, so `figure < floor` in PromQL
    finds the x8 link or the lost NVLink the check failed on."""
    out = []
    r = facts.init.report if facts.init else None
    init: dict[int, float | None] = {}
    for d in r.devices if r else []:
        _, index = _gpu_of(d.index, r, facts.inventory)  # type: ignore[arg-type]
        if index != "N":
            init[int(index)] = d.seconds
    joined = shape is not None and shape.fabric in ("nvswitch", "nvlink")
    expect = node_nvlinks(expect, facts.inventory, shape.fabric if shape else "unknown")
    for g in facts.inventory.gpus:
        labels = {"gpu": str(g.index), "UUID": g.uuid}  # dcgm-exporter's label names, so joins work
        # A GPU with no NVLink peer is not held to the SKU's link count (see gpu_health._judge_nvlinks).
        nvlink_floor = expect.nvlinks if expect and expect.nvlinks and (joined or (g.nvlinks_active or 0) > 0) else None
        loaded = (facts.pcie_loaded or {}).get(g.pci_bus_id)  # this GPU's link while the worker copied to it
        width = loaded.width if loaded and loaded.width else g.pcie.width  # as gpu_health.judge_link reads it
        gen = loaded.gen if loaded and loaded.gen else g.pcie.gen
        values = [  # name, unit, value, floor (as gpu_health's judge_gpu and judge_link hold it)
            ("gpu_temperature", "celsius", g.temperature_c, None),
            ("gpu_power_limit", "watts", g.power_limit_w, None),
            ("gpu_ecc_uncorrectable_volatile", "errors", g.ecc_uncorrectable_volatile, None),
            ("gpu_ecc_uncorrectable_aggregate", "errors", g.ecc_uncorrectable_aggregate, None),
            ("gpu_nvlinks_active", "links", g.nvlinks_active, nvlink_floor),
            ("gpu_pcie_link_width", "lanes", width, g.pcie.width_max),
            # preflight_gpu_pcie_link_generation: the unit once. Judged only under load: an idle link drops to Gen1.
            ("gpu_pcie_link", "generation", gen, g.pcie.gen_max if loaded and loaded.gen else None),
            ("gpu_cuda_init_duration", "seconds", init.get(g.index), None),
        ]
        out += [Measurement(name=n, unit=u, value=float(v), labels=labels, floor=floor) for n, u, v, floor in values if v is not None and math.isfinite(v)]
    return out


def pcie_generation(facts: CudaFacts) -> str:
    if facts.pcie_loaded:
        return "judged under load"
    return f"not judged: {facts.pcie_unjudged or 'no reading under load (idle links drop to Gen1)'}"


def summary(facts: CudaFacts, shape: NodeShape | None = None) -> str:
    inv = facts.inventory
    gpus = ", ".join(f"{n} x {name}" for name, n in Counter(g.name for g in inv.gpus).items()) or "no GPU"
    r = facts.init.report if facts.init else None
    cuda = f"; CUDA init on every GPU in {facts.init.seconds:.1f} s (torch {r.torch_version}, CUDA {r.cuda_runtime}, NCCL {r.nccl_version})" if facts.init and r else ""
    joined = f" ({shape.describe()})" if shape else ""
    skipped = f"; CUDA init not run: {facts.init_skipped}" if facts.init is None and facts.init_skipped else ""
    # A log no source could read shows no Xid: the summary must not vouch for it (xid_unjudged says why).
    xids = "Xid errors since boot not judged (kernel log unreadable)" if xid_unjudged(facts) else "no fatal Xid since boot"
    return f"{gpus}{joined}, driver {inv.driver_version} (CUDA {inv.cuda_driver_version}){cuda}; {xids}{skipped}"


class Cuda(Check):
    name = "cuda"
    description = "driver and NVML health of every GPU (ECC, row remaps, PCIe link, slowdown, MIG), Xid errors since boot, CUDA init on every GPU"
    timeout_seconds = 60.0
    order = 10

    def ranks_wanted(self, ctx: Context) -> int | None:
        return None if ctx.settings.level == "quick" else launch_ranks(ctx)  # quick starts no CUDA work

    def run(self, ctx: Context) -> Result | Waiting:
        try:
            facts = gather(ctx)
        except nvml.NvmlUnavailable as e:
            return self.result(Status.FAIL, e.cause, cause=e.cause, remedy=e.remedy)
        if facts.init_skipped is None and ctx.worlds is not None and ctx.worlds.starting() is not None:
            # The ranks still import torch (seconds on a GPU node): the checks that need no
            # ranks run meanwhile, and CUDA init goes on once the ranks are up.
            worlds = ctx.worlds
            return Waiting(ready=lambda: worlds.starting() is None, rest=lambda: self.judged(ctx, probe(ctx, facts)))
        return self.judged(ctx, probe(ctx, facts) if facts.init_skipped is None else facts)

    def judged(self, ctx: Context, facts: CudaFacts) -> Result:
        parts = judge(facts, ctx.shape, ctx.profile.gpu, ctx.settings.driver_version)
        details = facts.model_dump(mode="json")
        details["parts"] = {name: worst(found) for name, found in parts.items()}
        if facts.init is None:
            details["parts"]["cuda_init"] = f"not run: {facts.init_skipped}"
        if unjudged := xid_unjudged(facts):
            details["parts"]["xid"] = unjudged
        details["pcie_generation"] = pcie_generation(facts)
        details["recovery_action"] = recovery_actions(facts.inventory)  # by GPU index; where unknown, why
        if facts.init and facts.init.report:
            r = facts.init.report
            details["versions"] = {"driver": facts.inventory.driver_version, "cuda_driver": facts.inventory.cuda_driver_version, "torch": r.torch_version, "cuda_runtime": r.cuda_runtime, "nccl": r.nccl_version}
        findings = [f for found in parts.values() for f in found]
        # Said where a person reads it: an unjudged generation must not pass unnoticed.
        lines = [f"PCIe generation {details['pcie_generation']}"] if not facts.pcie_loaded and facts.init is not None else []
        sources = kernel_log_sources(facts.kernel_log, facts.kernel_log_unread)
        details.update(sources.details())
        lines += [line] if (line := sources.line()) else []
        lines += [f"kernel log: {facts.kernel_log_note}"] if facts.kernel_log_note else []
        lines += [f"Xid errors since boot: {unjudged}"] if unjudged else []
        # A job's own Xids stay in the kernel log until a reboot: said, not held against the node.
        not_given = ctx.shape.not_given() if ctx.shape else set()
        details["xid_jobs"] = job_xids(facts.xid_events, facts.inventory, not_given)
        lines += [f"a job's own Xid since boot, not the node's: {line}" for line in details["xid_jobs"]]
        details["xid_elsewhere"] = elsewhere_xids(facts.xid_events, facts.inventory, not_given)
        lines += [f"Xid since boot not judged here: {line}" for line in details["xid_elsewhere"]]
        result = self.conclude(findings, summary(facts, ctx.shape), measurements=measurements(facts, ctx.profile.gpu, ctx.shape) + sources.measurements(),
                               details=details, lines=lines)
        passed = [name for name, found in parts.items() if not any(f.status == FAIL for f in found)
                  and not (name == "cuda_init" and facts.init is None) and not (name == "xid" and unjudged)]
        if findings and passed:
            result.summary += f" ({' and '.join(passed)} passed)"
        return result

