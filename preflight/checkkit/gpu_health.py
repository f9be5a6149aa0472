"""Every GPU's health as NVML reports it, judged: the count against the node's
shape, one model, the profile's PCI device ids and driver floor, and per GPU
ECC, row remaps and page retirement, the PCIe link, compute mode, clocks
events, NVML queries that did not answer, persistence, MIG, power cap,
NVLinks, memory size and the recovery action the driver reports.

Shared by the cuda check (NVML's inventory, the PCIe links read under the
cuda_init worker's load) and `preflight explain` of a saved `nvidia-smi -q`
(outputs/explain/explain_nvsmi.py): one judge, two readers.
"""

from __future__ import annotations

from collections import Counter

from preflight.base.actions import Action, Domain, Next
from preflight.base.findings import Finding, Status
from preflight.pipeline.expectations import GpuExpect
from preflight.pipeline.shape import NodeShape
from preflight.readers.nvidia import nvml_facts
from preflight.readers.nvidia.nvml_facts import Gpu, Inventory, PcieLink
from preflight.readers.nvidia.nvml_inventory import RECOVERY_ASK, RECOVERY_FIELD

DRAIN = "drain the node and run `dcgmi diag -r 3` on it; open an RMA if the fault returns"
RESET = "reset the GPU (`nvidia-smi -r -i {i}`, with no process on it) or reboot the node"
FAIL, WARN = Status.FAIL, Status.WARN
HELD = "in every reading"
# What each kind of fault asks of a fleet's automation (preflight/base/actions.py), where the
# status's default (a FAIL drains for a person) says less than is known.
GONE = Next(Action.SERVICE, Domain.NODE, "a GPU the node has lost to NVML or the PCI bus: reseat or replace")
RESET_FIXES = Next(Action.RESET_GPU, Domain.NODE, "a GPU reset completes it (nvidia-smi -r): pending remaps, retired pages")
# nvidia-smi -r cannot reach a GPU NVML has lost (as Xid 79's catalog bucket, RESTART_BM, says of one off the bus).
LOST = Next(Action.REBOOT, Domain.NODE, "a GPU lost to NVML: a reset cannot reach it, only a reboot brings it back")
WORN_OUT = Next(Action.SERVICE, Domain.NODE, "hardware beyond its own repair: out of spare rows, a PCIe link below the slot's, mixed boards")
SETUP = Next(Action.DRAIN, Domain.SOFTWARE, "the node's setup (driver, MIG, compute mode, the site's pins): fix it before a job runs")  # the live check's clocks events: what held through its window of NVML readings


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isdigit() and len(p) <= 18)  # longer: no driver's number


def who(g: Gpu) -> str:
    """How every finding names a GPU; `preflight explain` swaps it for the name its capture prints."""
    return f"GPU {g.index} ({nvml_facts.short_pci(g.pci_bus_id)})"


def judge_count(inv: Inventory, shape: NodeShape | None) -> list[Finding]:
    """GPUs this process may use that NVML does not show, and a site's pinned count.
    The count comes from the node (the PCI bus, its device nodes), never from the
    profile: a container is not failed for the host's GPUs it was not given."""
    out: list[Finding] = []
    known = {nvml_facts.short_pci(g.pci_bus_id) for g in [*inv.gpus, *inv.lost] if g.pci_bus_id}
    silent = [bus for bus in (shape.slots if shape else []) if bus not in known]  # ours, on the bus, unknown to NVML
    for lost in inv.lost:
        where = nvml_facts.short_pci(lost.pci_bus_id) if lost.pci_bus_id else "PCI address unknown"
        hint = f"; on the PCI bus but not answering NVML: {', '.join(silent)}" if silent and not lost.pci_bus_id else ""
        cause = f"NVML cannot reach GPU {lost.index} ({where}): {lost.error}{hint}"
        out.append(Finding(FAIL, f"GPU {lost.index} ({where}) is lost", cause, RESET.format(i=lost.index) + "; if it stays lost, " + DRAIN, act=LOST))
    seen = len(inv.gpus) + len(inv.lost)
    fix = "look for 'fallen off the bus' in `preflight xid`; reseat or replace the GPU; " + DRAIN
    if shape is not None and seen < shape.gpus:
        named = f"; on the PCI bus but not in NVML: {', '.join(silent)}" if silent else ""
        cause = f"NVML sees {seen} GPUs, this node gives the run {shape.gpus} ({shape.gpus_from}){named}"
        out.append(Finding(FAIL, f"{seen} of {shape.gpus} GPUs visible", cause, fix, act=GONE))
    # The pin is the node's count: a GPU not given to this run is the node's all the same. Where NVML
    # counts and refuses such GPUs (a device cgroup), NVML's count says the node's, a GPU gone from
    # the driver included; where it lists the given ones alone, the PCI bus does (host_gpus: the
    # node's, where the run is given fewer).
    not_given = len(inv.refused) if inv.refused else (shape.host_gpus - shape.gpus if shape is not None and shape.host_gpus else 0)
    node_seen = seen + not_given
    if shape is not None and shape.pinned is not None and node_seen < shape.pinned:
        seen = node_seen
        cause = f"NVML sees {seen} GPUs, the site pins {shape.pinned} ([node] gpus, --node-gpus or PREFLIGHT_NODE_GPUS); the node shows {shape.gpus} ({shape.gpus_from})"
        out.append(Finding(FAIL, f"{seen} of {shape.pinned} pinned GPUs visible", cause, fix + "; if this node is meant to have fewer, change the pin", act=GONE))
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
                out.append(Finding(FAIL, f"{name} is not this profile's GPU", cause, "run with the profile for this GPU (`preflight detect` names it)", act=SETUP))
        if expect.driver_min and _version(inv.driver_version) < _version(expect.driver_min):
            cause = f"driver {inv.driver_version} is older than {expect.driver_min}, the first that supports this GPU ({expect.driver_source})"
            out.append(Finding(FAIL, f"driver {inv.driver_version} is too old", cause, f"install driver {expect.driver_min} or newer and reboot", act=SETUP))
    if driver_pin and inv.driver_version != driver_pin:
        cause = f"the site config pins driver {driver_pin}; this node runs {inv.driver_version}"
        out.append(Finding(FAIL, f"driver {inv.driver_version}, site pins {driver_pin}", cause, f"install driver {driver_pin}, or change driver_version in the config", act=SETUP))
    fabric = shape.fabric if shape else "unknown"
    expect = node_nvlinks(expect, inv, fabric)
    for g in inv.gpus:
        out += judge_gpu(g, expect, (loaded or {}).get(g.pci_bus_id), fabric, held)
    return out


def node_nvlinks(expect: GpuExpect | None, inv: Inventory, fabric: str) -> GpuExpect | None:
    """``expect`` with a link count the node itself gives, where the profile names no SKU count
    (``nvlinks_from_node``). On an NVSwitch every GPU has the same links, so one with fewer than
    the node's best has lost some. GPUs joined directly may differ by design (a cube mesh gives
    some GPUs more links than others): there the count most of them have, where most agree."""
    if expect is None or not expect.nvlinks_from_node or expect.nvlinks or fabric not in ("nvswitch", "nvlink"):
        return expect
    counts = Counter(g.nvlinks_active for g in inv.gpus if g.nvlinks_active is not None)
    if fabric == "nvswitch":
        n = max(counts, default=0)
        best = next((g for g in inv.gpus if g.nvlinks_active == n), None)
        said = f"the most any GPU of this node has ({who(best)}: {n})" if best else ""
    else:
        n, held = counts.most_common(1)[0] if counts else (0, 0)
        n = n if held * 2 > len(inv.gpus) else 0
        said = f"the count {held} of the node's {len(inv.gpus)} GPUs have"
    if not n:
        return expect
    return expect.model_copy(update={"nvlinks": n, "nvlinks_source": f"{said}; the profile names no count for this model"})


def judge_models(models: Counter[tuple[str, str | None]]) -> list[Finding]:
    """GPUs by (name, PCI device id): more than one key is more than one SKU."""
    if len(models) <= 1:
        return []
    mix = ", ".join(f"{n} x {name}" + (f" ({dev})" if dev else "") for (name, dev), n in models.most_common())
    return [Finding(FAIL, "mixed GPU models", f"one node, several SKUs: {mix}", "a data-parallel job runs at the slowest GPU's speed: make the node uniform, or drain it", act=WORN_OUT)]


def judge_gpu(g: Gpu, expect: GpuExpect | None, loaded: PcieLink | None = None, fabric: str = "unknown", held: str = HELD) -> list[Finding]:
    name, reset = who(g), RESET.format(i=g.index)
    out: list[Finding] = []
    if g.ecc_uncorrectable_volatile:
        cause = f"{name} has {g.ecc_uncorrectable_volatile} uncorrectable (volatile) ECC errors since the driver loaded: its memory returned wrong data"
        out.append(Finding(FAIL, f"{name}: uncorrectable ECC errors", cause, f"{reset}; {DRAIN}", act=RESET_FIXES))
    if g.ecc_mode is False and g.ecc_default is not False:  # off as the card ships (a workstation card's default) is no change to flag
        out.append(Finding(WARN, f"{name}: ECC is off", f"ECC is disabled on {name}: memory errors go undetected", f"`nvidia-smi -i {g.index} -e 1` and reboot"))
    rows = g.remapped_rows
    if rows and rows.failure:
        out.append(Finding(FAIL, f"{name}: row remapping failed", f"{name} could not remap a failing memory row (out of spare rows)", "drain the node and RMA the GPU", act=WORN_OUT))
    elif rows and rows.pending:
        cause = f"{name} has a memory row remap pending ({rows.uncorrectable} uncorrectable, {rows.correctable} correctable rows remapped): the faulty row is still in use"
        out.append(Finding(FAIL, f"{name}: row remap pending", cause, f"{reset}: a reset activates the remap (reset required)", act=RESET_FIXES))
    if g.inforom_valid is False:
        cause = (f"NVML reports {name}'s InfoROM corrupted (nvmlDeviceValidateInforom: NVML_ERROR_CORRUPTED_INFOROM): the store of "
                 "its ECC error counts, retired pages and settings cannot be trusted")
        out.append(Finding(FAIL, f"{name}: InfoROM corrupted", cause, "drain the node and have the GPU's InfoROM restored or the GPU replaced (RMA)", act=WORN_OUT))
    if g.retired_pages_pending:
        out.append(Finding(FAIL, f"{name}: page retirement pending", f"{name} has retired memory pages waiting for a reset", f"{reset}: a reset completes the retirement (reset required)", act=RESET_FIXES))
    out += judge_link(g, loaded)
    out += judge_compute_mode(g)
    out += _judge_clocks(g, held)
    out += _judge_unanswered(g)
    out += judge_recovery(g)
    if g.persistence_mode is False:
        cause = f"persistence mode is off on {name}: every CUDA start re-initialises the GPU (seconds each)"
        out.append(Finding(WARN, f"{name}: persistence mode off", cause, "enable nvidia-persistenced (`systemctl enable --now nvidia-persistenced`)"))
    if g.mig_mode and (expect is None or expect.whole_gpus):
        out.append(Finding(FAIL, f"{name}: MIG enabled", f"MIG mode is on for {name}; the profile expects whole GPUs", f"`nvidia-smi -i {g.index} -mig 0`, then reset the GPU", act=SETUP))
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
    return [Finding(FAIL, f"{who(g)}: compute mode PROHIBITED", cause, f"`nvidia-smi -i {g.index} -c DEFAULT` (as root), unless the GPU was fenced off on purpose", act=SETUP)]


def prohibited(inv: Inventory) -> list[Gpu]:
    return [g for g in inv.gpus if g.compute_mode == "prohibited"]


# Health queries whose silence must fail the gate: unknown ECC or remap state is not clean.
HEALTH_QUERIES = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus")


def _judge_unanswered(g: Gpu) -> list[Finding]:
    asked = {fn: err for fn, err in g.unanswered.items() if fn != RECOVERY_ASK}  # a recovery action unsaid is unknown, no finding
    if not asked:
        return []
    name = who(g)
    calls = ", ".join(f"{fn} ({err})" for fn, err in asked.items())
    status = FAIL if any(fn in asked for fn in HEALTH_QUERIES) else WARN
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
    held_to = "its peers have" if expect.nvlinks_from_node else "the SKU has"
    cause = f"{name} has {g.nvlinks_active} active NVLinks{down}, {held_to} {expect.nvlinks} ({expect.nvlinks_source})"
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
        out.append(Finding(FAIL, f"{name}: PCIe link x{width} of x{idle.width_max}", cause, fix, act=WORN_OUT))
    if loaded and loaded.gen and idle.gen_max and loaded.gen < idle.gen_max:
        cause = f"{name}'s PCIe link ran at Gen{loaded.gen} under load; GPU and slot allow Gen{idle.gen_max}"
        out.append(Finding(FAIL, f"{name}: PCIe Gen{loaded.gen} of Gen{idle.gen_max} under load", cause, fix, act=WORN_OUT))
    return out


# What the driver's recovery action asks (nvml.h nvmlDeviceGpuRecoveryAction_t; NVIDIA's words
# for each: docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html,
# "Recovery action flag", for none to drain-and-reset; the last three, newer, as nvidia-ml-py's
# pynvml.py and cuda-python's DeviceGpuRecoveryAction name them), as a rung of the ladder:
# words, action, domain, cause, remedy.
# DRAIN_P2P is a drain: the GPU's peer-to-peer traffic must be quiesced before NVML names the
# next action, so the node takes no new job (a job's P2P traffic is what must stop) until then.
_RECOVERY = {
    "gpu_reset": ("GPU reset", Action.RESET_GPU, Domain.NODE, "{name} hit a fault that only a GPU reset clears",
                  "stop every process on the GPU, then `nvidia-smi -r -i {i}`; new processes may use it after"),
    "node_reboot": ("node reboot", Action.REBOOT, Domain.NODE, "a fault on {name} may have left the OS in an inconsistent state",
                    "reboot the node"),
    "drain_p2p": ("drain P2P", Action.DRAIN, Domain.NODE, "{name} hit a fault that needs all its peer-to-peer traffic quiesced",
                  "take no new job on the node; stop the processes doing P2P on the GPU and turn UVM persistence mode off; "
                  "run preflight again once they are gone: NVML then names one of the other actions"),
    "drain_and_reset": ("drain P2P and reset the GPU", Action.RESET_GPU, Domain.NODE,
                        "{name} hit a fault that needs its peer-to-peer traffic drained and then a GPU reset",
                        "take no new job on the node; stop every process on the GPU, then `nvidia-smi -r -i {i}`"),
    "bus_reset": ("PCIe bus reset", Action.RESET_GPU, Domain.NODE, "{name} hit a fault that needs its PCIe bus reset",
                  "stop every process on the GPU, then reset its PCIe bus (a secondary bus reset, from the host where this node is a VM), else reboot"),
    "system_reboot": ("system reboot", Action.REBOOT, Domain.NODE, "a fault on {name} needs the whole system restarted",
                      "reboot the system (where this node is a VM, its host)"),
    "recover_imex_domain": ("IMEX domain recovery", Action.DRAIN, Domain.SOFTWARE, "{name}'s IMEX domain (memory shared across nodes) needs recovery",
                            "take no new job on the node; have the IMEX domain recovered (nvidia-imex on the domain's nodes), then run preflight again"),
}
RECOVERY_WORDS = {"none": "none", **{k: v[0] for k, v in _RECOVERY.items()}}


def judge_recovery(g: Gpu) -> list[Finding]:
    """The driver's own word on what the GPU needs (NVML's recovery action): any action but
    none FAILs, at its rung. Unsaid (an older driver, NVML that did not answer) is unknown,
    never a finding: `recovery_actions` says it in details."""
    if g.recovery_action in (None, "none"):
        return []
    words, action, domain, cause, remedy = _RECOVERY[g.recovery_action]
    name, i = who(g), g.index
    source = f"NVML recovery action on GPU {i}: {words} (nvmlDeviceGetFieldValues, field {RECOVERY_FIELD})"
    cause = f"{cause.format(name=name)}: the driver reports recovery action {words} (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"
    return [Finding(FAIL, f"{name}: NVML asks for {words}", cause, remedy.format(i=i), act=Next(action, domain, source))]


def recovery_actions(inv: Inventory) -> dict[str, str]:
    """Each GPU's recovery action in words, by index, for details: unknown ones say why."""
    out = {}
    for g in inv.gpus:
        if g.recovery_action is not None:
            out[str(g.index)] = RECOVERY_WORDS[g.recovery_action]
        elif RECOVERY_ASK in g.unanswered:
            out[str(g.index)] = f"unknown (driver does not report it: NVML answered {g.unanswered[RECOVERY_ASK]})"
        else:
            out[str(g.index)] = "unknown (driver does not report it)"
    return out
