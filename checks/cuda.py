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
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections import Counter

from pydantic import BaseModel

from preflight.checkkit.sources import Sources, one_fact
from preflight.gpuwork import interpreter, launch
from preflight.gpuwork.cuda_init import InitOutcome, InitReport, loaded_links, run_init
from preflight.readers import nvml, xid
from preflight.pipeline.check import Check, Context, Result, Waiting
from preflight.base.findings import Finding, Measurement, Status, worst
from preflight.readers.nvml import Gpu, Inventory, PcieLink
from preflight.pipeline.expectations import GpuExpect
from preflight.pipeline.shape import NodeShape

MARGIN = 5.0  # seconds kept from the check's deadline to judge and report a hung worker

DRAIN = "drain the node and run `dcgmi diag -r 3` on it; open an RMA if the fault returns"
RESET = "reset the GPU (`nvidia-smi -r -i {i}`, with no process on it) or reboot the node"
TORCH = "point --python at the training environment's interpreter, or install a CUDA build of torch there"
FAIL, WARN = Status.FAIL, Status.WARN
HELD = "in every reading"  # the live check's clocks events: what held through its window of NVML readings
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
        log = xid.read_log(ctx.host, timeout=min(10.0, _left(ctx)))
        events, kernel_log, unread, note = xid.parse(log.text), log.source, log.unread, log.note
    except xid.KernelLogUnavailable as e:
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


def launch_ranks(ctx: Context) -> int:
    """The ranks of the launch cuda_init starts: the one the nccl, bandwidth and train checks will share."""
    return ctx.ranks(ctx.profile.nccl.ranks if ctx.profile.nccl else None)


def _left(ctx: Context) -> float:
    return max(1.0, min(ctx.deadline - time.monotonic(), 3600.0))


# ---- judging ---------------------------------------------------------------


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit())


def who(g: Gpu) -> str:
    """How every finding names a GPU; `preflight explain` swaps it for the name its capture prints."""
    return f"GPU {g.index} ({nvml.short_pci(g.pci_bus_id)})"


def judge_count(inv: Inventory, shape: NodeShape | None) -> list[Finding]:
    """GPUs this process may use that NVML does not show, and a site's pinned count.
    The count comes from the node (the PCI bus, its device nodes), never from the
    profile: a container is not failed for the host's GPUs it was not given."""
    out: list[Finding] = []
    known = {nvml.short_pci(g.pci_bus_id) for g in [*inv.gpus, *inv.lost] if g.pci_bus_id}
    silent = [bus for bus in (shape.slots if shape else []) if bus not in known]  # ours, on the bus, unknown to NVML
    for lost in inv.lost:
        where = nvml.short_pci(lost.pci_bus_id) if lost.pci_bus_id else "PCI address unknown"
        hint = f"; on the PCI bus but not answering NVML: {', '.join(silent)}" if silent and not lost.pci_bus_id else ""
        cause = f"NVML cannot reach GPU {lost.index} ({where}): {lost.error}{hint}"
        out.append(Finding(FAIL, f"GPU {lost.index} ({where}) is lost", cause, RESET.format(i=lost.index) + "; if it stays lost, " + DRAIN))
    seen = len(inv.gpus) + len(inv.lost)
    fix = "look for 'fallen off the bus' in `preflight xid`; reseat or replace the GPU; " + DRAIN
    if shape is not None and seen < shape.gpus:
        named = f"; on the PCI bus but not in NVML: {', '.join(silent)}" if silent else ""
        cause = f"NVML sees {seen} GPUs, this node gives the run {shape.gpus} ({shape.gpus_from}){named}"
        out.append(Finding(FAIL, f"{seen} of {shape.gpus} GPUs visible", cause, fix))
    if shape is not None and shape.pinned is not None and seen < shape.pinned:
        cause = f"NVML sees {seen} GPUs, the site pins {shape.pinned} ([node] gpus, --node-gpus or PREFLIGHT_NODE_GPUS); the node shows {shape.gpus} ({shape.gpus_from})"
        out.append(Finding(FAIL, f"{seen} of {shape.pinned} pinned GPUs visible", cause, fix + "; if this node is meant to have fewer, change the pin"))
    return out


def judge_inventory(
    inv: Inventory,
    shape: NodeShape | None,
    expect: GpuExpect | None,
    driver_pin: str | None = None,
    loaded: dict[str, PcieLink] | None = None,
    held: str = HELD,
    mixed: bool = True,
) -> list[Finding]:
    """`held` and `mixed`: for `preflight explain`, whose capture is one reading and may
    have cut a GPU's model (it judges the models itself with judge_models)."""
    out = judge_count(inv, shape)
    models = Counter((g.name, g.pci_device_id) for g in inv.gpus)
    if mixed:
        out += judge_models(models)
    if expect is not None:
        for name, dev in models:
            if dev and expect.pci_device_ids and dev not in expect.pci_device_ids:
                cause = f"PCI device id {dev} ({name}) is not one of the profile's {', '.join(expect.pci_device_ids)}"
                out.append(Finding(FAIL, f"{name} is not this profile's GPU", cause, "run with the profile for this GPU (`preflight detect` names it)"))
        if _version(inv.driver_version) < _version(expect.driver_min):
            cause = f"driver {inv.driver_version} is older than {expect.driver_min}, the first that supports this GPU ({expect.driver_source})"
            out.append(Finding(FAIL, f"driver {inv.driver_version} is too old", cause, f"install driver {expect.driver_min} or newer and reboot"))
    if driver_pin and inv.driver_version != driver_pin:
        cause = f"the site config pins driver {driver_pin}; this node runs {inv.driver_version}"
        out.append(Finding(FAIL, f"driver {inv.driver_version}, site pins {driver_pin}", cause, f"install driver {driver_pin}, or change driver_version in the config"))
    fabric = shape.fabric if shape else "unknown"
    for g in inv.gpus:
        out += judge_gpu(g, expect, (loaded or {}).get(g.pci_bus_id), fabric, held)
    return out


def judge_models(models: Counter[tuple[str, str | None]]) -> list[Finding]:
    """GPUs by (name, PCI device id): more than one key is more than one SKU."""
    if len(models) <= 1:
        return []
    mix = ", ".join(f"{n} x {name}" + (f" ({dev})" if dev else "") for (name, dev), n in models.most_common())
    return [Finding(FAIL, "mixed GPU models", f"one node, several SKUs: {mix}", "a data-parallel job runs at the slowest GPU's speed: make the node uniform, or drain it")]


def judge_gpu(g: Gpu, expect: GpuExpect | None, loaded: PcieLink | None = None, fabric: str = "unknown", held: str = HELD) -> list[Finding]:
    name, reset = who(g), RESET.format(i=g.index)
    out: list[Finding] = []
    if g.ecc_uncorrectable_volatile:
        cause = f"{name} has {g.ecc_uncorrectable_volatile} uncorrectable (volatile) ECC errors since the driver loaded: its memory returned wrong data"
        out.append(Finding(FAIL, f"{name}: uncorrectable ECC errors", cause, f"{reset}; {DRAIN}"))
    if g.ecc_mode is False:
        out.append(Finding(WARN, f"{name}: ECC is off", f"ECC is disabled on {name}: memory errors go undetected", f"`nvidia-smi -i {g.index} -e 1` and reboot"))
    rows = g.remapped_rows
    if rows and rows.failure:
        out.append(Finding(FAIL, f"{name}: row remapping failed", f"{name} could not remap a failing memory row (out of spare rows)", "drain the node and RMA the GPU"))
    elif rows and rows.pending:
        cause = f"{name} has a memory row remap pending ({rows.uncorrectable} uncorrectable, {rows.correctable} correctable rows remapped): the faulty row is still in use"
        out.append(Finding(FAIL, f"{name}: row remap pending", cause, f"{reset}: a reset activates the remap (reset required)"))
    if g.retired_pages_pending:
        out.append(Finding(FAIL, f"{name}: page retirement pending", f"{name} has retired memory pages waiting for a reset", f"{reset}: a reset completes the retirement (reset required)"))
    out += judge_link(g, loaded)
    out += judge_compute_mode(g)
    out += _judge_clocks(g, held)
    out += _judge_unanswered(g)
    if g.persistence_mode is False:
        cause = f"persistence mode is off on {name}: every CUDA start re-initialises the GPU (seconds each)"
        out.append(Finding(WARN, f"{name}: persistence mode off", cause, "enable nvidia-persistenced (`systemctl enable --now nvidia-persistenced`)"))
    if g.mig_mode and (expect is None or expect.whole_gpus):
        out.append(Finding(FAIL, f"{name}: MIG enabled", f"MIG mode is on for {name}; the profile expects whole GPUs", f"`nvidia-smi -i {g.index} -mig 0`, then reset the GPU"))
    if g.power_limit_w and g.power_default_limit_w and g.power_limit_w < g.power_default_limit_w * 0.99:
        cause = f"{name}'s power limit is {g.power_limit_w:g} W, below its default {g.power_default_limit_w:g} W"
        out.append(Finding(WARN, f"{name}: power capped", cause, f"`nvidia-smi -i {g.index} -pl {g.power_default_limit_w:g}` unless the cap is intended"))
    if expect and expect.nvlinks:
        out += _judge_nvlinks(g, expect, fabric)
    if expect and expect.memory_min_bytes and g.memory_total_bytes is not None and g.memory_total_bytes < expect.memory_min_bytes:
        cause = f"{name} reports {g.memory_total_bytes} bytes of memory, the SKU at least {expect.memory_min_bytes} ({expect.memory_source})"
        out.append(Finding(FAIL, f"{name}: less memory than the SKU", cause, "check the GPU model and retired pages; " + DRAIN))
    return out


def judge_compute_mode(g: Gpu) -> list[Finding]:
    """What a job can do in the GPU's compute mode: PROHIBITED lets no process create a
    context, so no job runs there; EXCLUSIVE_PROCESS lets one process hold it, which is
    what a job of one process per GPU is, so it is no finding (the checks that would need
    a second context on a GPU leave those steps out and say why)."""
    if g.compute_mode != "prohibited":
        return []
    cause = f"{who(g)} is in compute mode PROHIBITED: no process can create a CUDA context on it, so no job can use it"
    return [Finding(FAIL, f"{who(g)}: compute mode PROHIBITED", cause, f"`nvidia-smi -i {g.index} -c DEFAULT` (as root), unless the GPU was fenced off on purpose")]


def prohibited(inv: Inventory) -> list[Gpu]:
    return [g for g in inv.gpus if g.compute_mode == "prohibited"]


# Health queries whose silence must fail the gate: unknown ECC or remap state is not clean.
HEALTH_QUERIES = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus")


def _judge_unanswered(g: Gpu) -> list[Finding]:
    if not g.unanswered:
        return []
    name = who(g)
    calls = ", ".join(f"{fn} ({err})" for fn, err in g.unanswered.items())
    status = FAIL if any(fn in g.unanswered for fn in HEALTH_QUERIES) else WARN
    what = "its memory health is unknown" if status == FAIL else "some facts are unknown"
    return [Finding(status, f"{name}: NVML queries failed", f"NVML could not answer {calls} for {name}: {what}", RESET.format(i=g.index) + "; if it persists, " + DRAIN)]


def _judge_clocks(g: Gpu, held: str = HELD) -> list[Finding]:
    """Judged on what held through the NVML child's window of readings
    (``clocks_events``); events seen in some readings only are ``transient``.
    `held` says where the held events were seen, in the cause."""
    # HW slowdown is also set when the cause is thermal; the thermal bits say so.
    events, transient, name = set(g.clocks_events or []), set(g.clocks_events_transient or []), who(g)
    thermal = {"hw_thermal_slowdown", "sw_thermal_slowdown"}
    if "hw_power_brake_slowdown" in events:
        cause = f"{name} is held back by hardware power brake (the system asserted it: PSU or power-delivery fault)"
        return [Finding(FAIL, f"{name}: power brake active", cause, "check the node's power supplies and BMC event log; " + DRAIN)]
    if (events | transient) & thermal:
        temp = f" at {g.temperature_c} C" if g.temperature_c is not None else ""
        now = "" if events & thermal else " in some readings (transient)"
        return [Finding(WARN, f"{name}: thermal slowdown", f"{name} is slowed by temperature{temp}{now}", "check fans, airflow and inlet temperature; the GPU throttles under load")]
    if "hw_slowdown" in events:
        cause = f"{name} runs with HW slowdown engaged {held} (clocks cut by half or more: power or temperature sensor)"
        return [Finding(FAIL, f"{name}: hardware slowdown active", cause, "check the BMC's power and thermal events and `nvidia-smi -q -d PERFORMANCE`; " + DRAIN)]
    if "hw_power_brake_slowdown" in transient:
        # Not a clock-change artefact: the system asserted the brake, briefly. Worth a look, not a drain.
        cause = f"{name} was held back by hardware power brake in some readings only (transient): the system asserts it on a PSU or power-delivery fault"
        return [Finding(WARN, f"{name}: power brake asserted (transient)", cause, "check the node's power supplies and BMC event log")]
    # HW slowdown in some readings only: no finding. nvml.h documents the bit as
    # also reported during P-state or clock changes, which a healthy GPU goes
    # through all the time; a real slowdown holds through the window and FAILs
    # above. The transient bit stays in the facts (details) for whoever looks.
    return []


def _judge_nvlinks(g: Gpu, expect: GpuExpect, fabric: str) -> list[Finding]:
    """Links are judged only where the node joins its GPUs by NVLink: a GPU with no
    NVLink peer (a bridge-less PCIe card, a lone SXM GPU in a VM) answers
    "inactive" on every link, and that is its shape, not a fault."""
    name = who(g)
    joined = fabric in ("nvswitch", "nvlink")
    if g.nvlinks_active is None:
        if fabric != "nvswitch":
            return []
        cause = f"NVML does not report NVLink state for {name} on a node with NVSwitch, and its SKU has {expect.nvlinks} links (a VM that hides NVLink, or a driver fault)"
        return [Finding(WARN, f"{name}: NVLink state unknown", cause, "check `nvidia-smi nvlink -s`; the topology check measures the links")]
    if g.nvlinks_active >= expect.nvlinks or (g.nvlinks_active == 0 and not joined):
        return []
    down = f" (down: link {', '.join(map(str, g.nvlinks_down))})" if g.nvlinks_down else ""
    cause = f"{name} has {g.nvlinks_active} active NVLinks{down}, the SKU has {expect.nvlinks} ({expect.nvlinks_source})"
    remedy = f"check nvidia-fabricmanager and `nvidia-smi nvlink -s -i {g.index}`; {RESET.format(i=g.index)}; {DRAIN}"
    return [Finding(FAIL, f"{name}: {g.nvlinks_active} of {expect.nvlinks} NVLinks active", cause, remedy)]


def judge_link(g: Gpu, loaded: PcieLink | None) -> list[Finding]:
    """Width from any reading (links do not narrow at idle); generation only under load."""
    idle, name = g.pcie, who(g)
    width = loaded.width if loaded and loaded.width else idle.width
    fix = "reseat the GPU or its riser/cable, check the slot's BIOS link settings; " + DRAIN
    out = []
    if width and idle.width_max and width < idle.width_max:
        cause = f"{name}'s PCIe link trained at x{width}, its slot and GPU allow x{idle.width_max}: host<->GPU copies run at {width / idle.width_max:.0%} speed"
        out.append(Finding(FAIL, f"{name}: PCIe link x{width} of x{idle.width_max}", cause, fix))
    if loaded and loaded.gen and idle.gen_max and loaded.gen < idle.gen_max:
        cause = f"{name}'s PCIe link ran at Gen{loaded.gen} under load; GPU and slot allow Gen{idle.gen_max}"
        out.append(Finding(FAIL, f"{name}: PCIe Gen{loaded.gen} of Gen{idle.gen_max} under load", cause, fix))
    return out


def judge_xid(events: list[xid.XidEvent], inv: Inventory, forgeable: bool = False) -> list[Finding]:
    """One finding per (kind, code, GPU): the worst of its events, and how often. ``forgeable``:
    the log came through syslog(2), where a message's end is lost and any user's message can
    hold a line that reads as the driver's: a fatal event there WARNs (NVML's own facts, judged
    apart, still FAIL a lost GPU, ECC errors or a pending remap)."""
    by_slot = {nvml.slot(g.pci_bus_id): g for g in inv.gpus}  # kernel lines print "0000:10:1c"
    groups: dict[tuple[str, int | None, str | None], list[xid.XidEvent]] = {}
    for e in events:
        groups.setdefault((e.kind, e.code, e.pci), []).append(e)
    rank = {"info": 0, "app": 1, "fatal": 2}
    out = []
    for (kind, code, pci), group in groups.items():
        # Xid 154 announces the recovery action now needed: the last one counts.
        info = group[-1].info if code == 154 else max((e.info for e in group), key=lambda i: rank[i.severity])
        if info.severity == "info":
            continue
        g = by_slot.get(pci or "")
        gpu = f"GPU {g.index} ({pci})" if g else (pci or "an unknown GPU")
        label = {"xid": f"Xid {code}", "sxid": f"SXid {code}"}.get(kind, kind.replace("_", " "))
        status = FAIL if info.severity == "fatal" else WARN
        # Done only where NVML says so; unknown is not done.
        remap_done = g is not None and (
            (g.remapped_rows is not None and not g.remapped_rows.pending) or g.retired_pages_pending is False
        )
        if kind == "xid" and code == 63 and remap_done:
            status = WARN  # NVML's remap state is the truth: a reset since has activated it
        n = sum(e.count for e in group)
        times = f" ({n} times since boot)" if n > 1 else ""
        doubt = ""
        if forgeable and status == FAIL:
            status = WARN
            doubt = ("; read through syslog(2), which loses where a message ends, so another user's message may "
                     "imitate this line: `journalctl -k -b | grep NVRM` on the host tells")
        action = info.action + ("; the event stays in the kernel log, so this check fails until the node reboots" if status == FAIL else "")
        out.append(Finding(status, f"{label} on {gpu}", f"{label} on {gpu}{times}: {info.meaning}{doubt}", action))
    return out


_INIT_CAUSES = [
    # The driver's own words -> what has fixed it on real nodes.
    ("system not yet initialized", "the NVSwitch fabric is not up: nvidia-fabricmanager is not running or failed",
     "`systemctl enable --now nvidia-fabricmanager` (its version must equal the driver's), then retry"),
    ("unknown error", "CUDA could not initialise a GPU (`CUDA unknown error`)",
     "check CUDA_VISIBLE_DEVICES; compare `cat /proc/driver/nvidia/version` with `nvidia-smi` (a kernel module/driver "
     "mismatch after an upgrade needs a reboot); reset the GPUs (`nvidia-smi -r`) or reboot; if it persists, " + DRAIN),
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
    by_bus = {nvml.short_pci(g.pci_bus_id): g for g in inv.gpus}
    g = by_bus.get(nvml.short_pci(bus)) if bus else None
    if g is None and bus is None and r.cuda_visible_devices is None:
        g = next((x for x in inv.gpus if x.index == cuda_index), None)
    if g is not None:
        return who(g), str(g.index)
    return f"CUDA device {cuda_index}" + (f" ({nvml.short_pci(bus)})" if bus else ""), "N"


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
    if r.device_count is not None and r.device_count != len(inv.gpus):
        hidden = f" (CUDA_VISIBLE_DEVICES={r.cuda_visible_devices})" if r.cuda_visible_devices is not None else ""
        cause = f"torch.cuda.device_count() is {r.device_count} but NVML lists {len(inv.gpus)} GPUs{hidden}"
        out.append(Finding(FAIL, f"CUDA sees {r.device_count} GPUs, NVML {len(inv.gpus)}", cause, "unset CUDA_VISIBLE_DEVICES for preflight; otherwise " + DRAIN))
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
    xids = judge_xid(facts.xid_events, inv, forgeable=facts.kernel_log_note == xid.SYSLOG_NOTE)
    if facts.kernel_log.startswith("unavailable"):
        cause = f"the kernel log could not be read, so Xid errors since boot are unknown: {facts.kernel_log}"
        xids.append(Finding(WARN, "Xid scan impossible", cause, "run preflight as root (or set kernel.dmesg_restrict=0), or check `preflight xid` by hand"))
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
    for g in facts.inventory.gpus:
        labels = {"gpu": str(g.index), "UUID": g.uuid}  # dcgm-exporter's label names, so joins work
        # A GPU with no NVLink peer is not held to the SKU's link count (see _judge_nvlinks).
        nvlink_floor = expect.nvlinks if expect and expect.nvlinks and (joined or (g.nvlinks_active or 0) > 0) else None
        loaded = (facts.pcie_loaded or {}).get(g.pci_bus_id)  # this GPU's link while the worker copied to it
        width = loaded.width if loaded and loaded.width else g.pcie.width  # as judge_link reads it
        gen = loaded.gen if loaded and loaded.gen else g.pcie.gen
        values = [  # name, unit, value, floor (as judge_gpu and judge_link hold it)
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
    return f"{gpus}{joined}, driver {inv.driver_version} (CUDA {inv.cuda_driver_version}){cuda}; no fatal Xid since boot{skipped}"


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
        details["pcie_generation"] = pcie_generation(facts)
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
        result = self.conclude(findings, summary(facts, ctx.shape), measurements=measurements(facts, ctx.profile.gpu, ctx.shape) + sources.measurements(),
                               details=details, lines=lines)
        passed = [name for name, found in parts.items() if not any(f.status == FAIL for f in found) and not (name == "cuda_init" and facts.init is None)]
        if findings and passed:
            result.summary += f" ({' and '.join(passed)} passed)"
        return result

