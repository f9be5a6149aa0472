"""`preflight explain` for a saved `nvidia-smi -q`: judged by the cuda check's own
judge (checkkit/gpu_health.py: one judge, two readers), so a pasted capture and a live run say the same
about the same GPU.

Each GPU block becomes the `nvml_facts.Gpu` NVML would have answered, and the whole
capture an `Inventory` for `judge_inventory`. Two things differ from a live run:

- One snapshot is one reading, and a healthy GPU sets HW Slowdown for a moment
  during P-state and clock changes (nvml.h says so). So HW Slowdown or HW Power
  Brake printed Active fails only where the capture shows its effect: the GPU at
  work (P0-P2 and the Idle reason not Active, as far as printed) with its SM or
  graphics clock printed, and under half its max clock where the max is printed
  too. Otherwise it is a WARN saying how to confirm it. The other reasons count
  as held, as the live check's would.
- The PCIe generation is judged only where the capture shows the GPU at work
  (a P0-P2 state, not idle, utilization above 0 % where printed): an idle GPU
  drops its link to Gen1 to save power, and that is no fault. The width is
  judged always, as the cuda check judges it.

The judge names a GPU by its NVML index; a capture has no index (a paste may
hold the second GPU of four), so every finding names the GPU by the bus id the
capture prints, and `nvidia-smi -i` takes that bus id.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from pydantic import ValidationError

from collections import Counter

from preflight.base.errors import UsageError
from preflight.checkkit import gpu_health
from preflight.outputs.explain.explained import Explained, Item, items
from preflight.pipeline.profiles import ResolvedProfile
from preflight.readers.nvidia import nvml_facts, nvsmi

KIND, TITLE = "nvidia-smi-q", "nvidia-smi -q"
_WORKING = ("P0", "P1", "P2")  # the performance states a GPU holds under load (P8 and above: idle)
_SNAPSHOT = ("hw_power_brake_slowdown", "hw_slowdown")  # the judge FAILs these when held; the brake wins, as there
_THERMAL = ("hw_thermal_slowdown", "sw_thermal_slowdown")  # the judge's own explanation of HW slowdown
_HELD = "in this capture's one reading, its clock cut to match"
_COUNTS = re.compile(r"\(\d+ uncorrectable, \d+ correctable rows remapped\)")


def explain(text: str, source: str, profile: ResolvedProfile | None = None) -> Explained:
    try:
        capture = nvsmi.parse(text)
        gpus = [to_gpu(i, g) for i, g in enumerate(capture.gpus)]
    except UsageError as e:
        raise UsageError(f"{source}: {e}") from None
    expect = profile.gpu if profile else None
    if expect is not None and capture.driver_version is None:
        # A fragment without its header: the driver floor cannot be judged, the rest can.
        expect = expect.model_copy(update={"driver_min": None})
    names = [_name(g, i, len(capture.gpus)) for i, g in enumerate(capture.gpus)]
    seen = [corroborated(g) for g in capture.gpus]
    loaded = {gpu.pci_bus_id: link for gpu, g in zip(gpus, capture.gpus) if (link := under_load(g)[0])}
    inventory = nvml_facts.Inventory(driver_version=capture.driver_version or "", cuda_driver_version=capture.cuda_version,
                               gpus=gpus, source=f"nvidia-smi -q {source}")
    models, mixed_unjudged = _models(capture.gpus, names)
    found: list[Item] = items(gpu_health.judge_models(models)) if models else []
    for f in gpu_health.judge_inventory(inventory, None, expect, None, loaded, held=_HELD, mixed=False):
        who = next((i for i, gpu in enumerate(gpus) if gpu_health.who(gpu) in f.summary), None)
        if who is None:
            found += items([f])
            continue
        g, bus = capture.gpus[who], capture.gpus[who].bus_id
        renamed = {k: _rename(getattr(f, k), gpus[who], names[who], bus) for k in ("summary", "cause", "remedy")}
        if f.summary.endswith(("hardware slowdown active", "power brake active")):
            renamed["cause"] += f"; one snapshot, and it shows the cut: {seen[who][1]}"
        if "row remap pending" in f.summary and None in (g.remapped_rows.correctable, g.remapped_rows.uncorrectable):
            counts = _why(g, "remap.correctable" if g.remapped_rows.correctable is None else "remap.uncorrectable")
            renamed["cause"] = _COUNTS.sub(f"(remapped row counts {counts})", renamed["cause"])
        found += items([dataclasses.replace(f, **renamed)], gpu=bus or (names[who] if len(gpus) > 1 else None))
    for g, name, (ok, why) in zip(capture.gpus, names, seen):
        found += snapshot_warning(g, name, ok, why)
    facts: dict[str, Any] = capture.model_dump(mode="json")
    if mixed_unjudged:
        facts["unjudged"] = {"mixed_gpu_models": mixed_unjudged}
    for g, name, out in zip(capture.gpus, names, facts["gpus"]):
        out["clocks_events_active"] = g.events_active
        out["unjudged"] = unjudged(g)
        link, why = under_load(g)
        gen, top = g.pcie.gen_current, g.pcie.gen_max
        if link is None and gen and top and gen < top:
            found.append(Item(severity="info", summary=f"{name}: PCIe Gen{gen} of Gen{top} not judged", gpu=g.bus_id,
                              cause=f"{name} was not at work when captured ({why}): an idle GPU drops its link to Gen1 to save power",
                              fix="capture the whole `nvidia-smi -q` while a job loads the GPU (`-d` has no PCIe section), or run `preflight run --only cuda`, which reads the link under load"))
    return Explained(kind=KIND, title=TITLE, source=source, findings=found, facts=facts)


def to_gpu(index: int, g: nvsmi.SmiGpu) -> nvml_facts.Gpu:
    """The facts NVML would have given for this block; None where the capture has none."""
    rows = g.remapped_rows
    # The judge reads pending and failure; an unknown one stands in as False (not judged, and
    # unjudged() says so), unknown counts as 0 (the explainer rewrites them in the cause).
    remap = None if rows.pending is None and rows.failure is None else nvml_facts.RemappedRows(
        correctable=rows.correctable or 0, uncorrectable=rows.uncorrectable or 0, pending=bool(rows.pending), failure=bool(rows.failure))
    events = g.events_active if corroborated(g)[0] else [e for e in g.events_active if e not in _SNAPSHOT]
    try:
        return _gpu(index, g, remap, events)
    except (ValidationError, ValueError) as e:  # a count below 0, a size past 64 bits: no value nvidia-smi prints
        where = ".".join(str(x) for x in e.errors()[0]["loc"]) if isinstance(e, ValidationError) else str(e)
        raise UsageError(f"GPU {index}'s {where} holds a value no nvidia-smi prints; is the capture edited or cut?") from None


def _gpu(index: int, g, remap, events) -> nvml_facts.Gpu:  # noqa: ANN001 - the capture's block and what was made of it above
    return nvml_facts.Gpu(
        index=index,
        name=g.product_name or "unknown GPU",
        uuid=g.uuid or "",
        # A stand-in: the capture's own bus id can be of any driver's form, and every finding is renamed anyway.
        pci_bus_id=f"00000000:{index // 32:02x}:{index % 32:02x}.0",
        pci_device_id=g.pci_device_id,
        persistence_mode=g.persistence_mode,
        mig_mode=g.mig_mode,
        memory_total_bytes=g.memory_total_mib * 2**20 if g.memory_total_mib is not None else None,
        ecc_mode=g.ecc.mode,
        ecc_uncorrectable_volatile=g.ecc.volatile_uncorrectable,
        ecc_uncorrectable_aggregate=g.ecc.aggregate_uncorrectable,
        retired_pages_pending=g.retired_pages.pending,
        remapped_rows=remap,
        pcie=nvml_facts.PcieLink(gen=_lane(g.pcie.gen_current), width=_lane(g.pcie.width_current),
                           gen_max=_lane(g.pcie.gen_max), width_max=_lane(g.pcie.width_max)),
        clocks_events=events if g.clocks_events else None,
        clocks_events_transient=[] if g.clocks_events else None,
        temperature_c=g.temperature_c,
        power_limit_w=g.power_limit_w,
        power_default_limit_w=g.power_default_limit_w,
    )


def under_load(g: nvsmi.SmiGpu) -> tuple[nvml_facts.PcieLink | None, str]:
    """The link as the judge's loaded reading where the capture shows the GPU at work, and why (not)."""
    state, idle, util = g.performance_state, g.clocks_events.get("gpu_idle"), g.utilization_gpu_pct
    seen = ", ".join(x for x in (state, f"{util} % utilization" if util is not None else None, "Idle reason active" if idle else None) if x)
    if state is None:
        return None, "no performance state printed"
    if state not in _WORKING or idle:
        return None, seen
    if util == 0 or (util is None and idle is None):
        return None, seen + ("" if util == 0 else ", neither utilization nor the Idle reason printed")
    return nvml_facts.PcieLink(gen=_lane(g.pcie.gen_current), width=_lane(g.pcie.width_current)), seen


def corroborated(g: nvsmi.SmiGpu) -> tuple[bool, str]:
    """Whether the capture shows the clock cut an active HW slowdown or power brake means, and what it shows."""
    state, idle = g.performance_state, g.clocks_events.get("gpu_idle")
    kind = next((k for k in ("sm", "graphics") if g.clocks_mhz.get(k)), None)
    clock, top = (g.clocks_mhz.get(kind), g.clocks_mhz.get(kind + "_max")) if kind else (None, None)
    if state is not None and state not in _WORKING:
        return False, f"{state}, not at work"
    if idle:
        return False, "the Idle reason active too"
    if state is None and idle is None:
        return False, "neither the performance state nor the Idle reason printed"
    if clock is None:
        return False, "no SM or graphics clock printed"
    at = f"{kind.upper() if kind == 'sm' else kind} clock {clock} MHz" + (f" of {top} MHz max" if top else "") + (f" at {state}" if state else ", the Idle reason not active")
    if top and clock * 2 >= top:
        return False, at + ", not cut by half"
    return True, at


def snapshot_warning(g: nvsmi.SmiGpu, name: str, ok: bool, why: str) -> list[Item]:
    """The WARN for HW slowdown or power brake Active in one reading that the capture does not corroborate."""
    active = [e for e in _SNAPSHOT if e in g.events_active]
    if ok or not active or (active == ["hw_slowdown"] and set(_THERMAL) & set(g.events_active)):
        return []  # judged as held, or thermal: the judge's thermal WARN already explains HW slowdown
    brake = active[0] == "hw_power_brake_slowdown"
    label = "HW power brake" if brake else "HW slowdown"
    normal = ("the system asserts the brake on a PSU or power-delivery fault, and may have for a moment" if brake
              else "a healthy GPU sets it for a moment during P-state and clock changes")
    cause = f"{name} printed {label} Active in this capture, which is one snapshot ({why}): {normal}"
    fix = ("run `nvidia-smi -q -d PERFORMANCE` a few times while a job loads the GPU (or `preflight run --only cuda`): "
           "Active in every reading with the clocks cut is a fault" + ("; check the node's power supplies and BMC event log" if brake else ""))
    return [Item(severity="warn", summary=f"{name}: {label} active in one snapshot", cause=cause, fix=fix, gpu=g.bus_id)]


def unjudged(g: nvsmi.SmiGpu) -> dict[str, str]:
    """The rules the judge could not apply to this GPU, and why: a fragment judges what it holds."""
    def why(group: str) -> str:
        return _why(g, group + ".")
    rows = g.remapped_rows
    out = {}
    if g.ecc.volatile_uncorrectable is None:
        out["ecc_volatile_uncorrectable"] = why("ecc")
    unknown = [k for k in ("correctable", "uncorrectable", "pending", "failure") if getattr(rows, k) is None]
    if g.remapped_rows_na:
        out["remapped_rows"] = "printed N/A: this GPU does not remap rows"
    elif len(unknown) == 4:
        out["remapped_rows"] = why("remap")
    elif unknown:  # judged on what is known: say which parts were not
        by_why: dict[str, list[str]] = {}
        for k in unknown:
            by_why.setdefault(_why(g, "remap." + k), []).append(k)
        out["remapped_rows"] = "; ".join(f"{', '.join(ks)} {w}" for w, ks in by_why.items())
    if g.retired_pages.pending is None:
        out["retired_pages_pending"] = why("retired")
    if g.pcie.width_current is None or g.pcie.width_max is None:
        out["pcie_width"] = why("pcie")
    if under_load(g)[0] is None:
        out["pcie_generation"] = why("pcie") if g.pcie.gen_current is None else f"not at work when captured ({under_load(g)[1]})"
    if not g.clocks_events:
        out["clocks_events"] = why("reasons")
    return out


def _why(g: nvsmi.SmiGpu, field: str) -> str:
    """Why a fact (a field id, or a group's prefix such as "ecc.") is unknown: its line says N/A, or there is none."""
    return "printed N/A or blank" if any(f.startswith(field) for f in g.printed_na) else "not in the capture"


def _models(smi: list[nvsmi.SmiGpu], names: list[str]) -> tuple[Counter, str | None]:
    """GPU models to compare, or why not: a GPU whose model the paste cut is no other model."""
    unnamed = [n for g, n in zip(smi, names) if not g.product_name]
    if len(smi) < 2:
        return Counter(), None
    if unnamed:
        return Counter(), f"the product name of {', '.join(unnamed)} is not in the capture"
    ids = all(g.pci_device_id for g in smi)  # device ids compared only where every GPU prints one
    return Counter((g.product_name, g.pci_device_id if ids else None) for g in smi), None


def _name(g: nvsmi.SmiGpu, i: int, count: int) -> str:
    """As the capture names the GPU: its bus id; a fragment's GPUs by their order in it."""
    return f"GPU {g.bus_id}" if g.bus_id else ("the GPU" if count == 1 else f"GPU #{i + 1} of the fragment")


def _rename(text: str, gpu: nvml_facts.Gpu, name: str, bus: str | None) -> str:
    text = text.replace(gpu_health.who(gpu), name)
    return re.sub(rf"(?<=-i ){gpu.index}\b", bus or "N", text)


def _lane(n: int | None) -> int | None:
    return n if n and n >= 1 else None
